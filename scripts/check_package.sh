#!/usr/bin/env bash
# The package as a user gets it: build the sdist and, from it, the wheel; check what
# the wheel holds; install it into a fresh virtual environment (with the `demo` extra)
# and run `idempotence demo` and the key-store example there, outside the checkout, so
# that nothing is imported from src/.
#
# Usage: scripts/check_package.sh [PYTHON]   (default: .venv/bin/python, which needs
# the `build` package: it is in the `test` extra). Takes about a minute, most of it
# installing the wheel's dependencies.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
python=${1:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

say() { printf -- '--- %s\n' "$*"; }

say "building the sdist and the wheel"
"$python" -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || {
    cat "$work/build.log"
    exit 1
}
wheel=$(echo "$work"/dist/idempotence-*.whl)
sdist=$(echo "$work"/dist/idempotence-*.tar.gz)
ls -l "$wheel" "$sdist"

say "checking what the wheel and the sdist hold"
"$python" - "$wheel" "$sdist" <<'EOF'
import sys
import tarfile
import zipfile
from email.parser import Parser

wheel, sdist = sys.argv[1], sys.argv[2]
names = set(zipfile.ZipFile(wheel).namelist())
info = next(n for n in names if n.endswith(".dist-info/METADATA"))
metadata = Parser().parsestr(zipfile.ZipFile(wheel).read(info).decode())
problems = []
for needed in (
    "idempotence/py.typed",
    "idempotence/stores/redis/redis.lua",
    "idempotence/sql/postgres/schema.sql",
    "idempotence/sql/postgres/queries.sql",
    "idempotence/sql/sqlite/schema.sql",
    "idempotence/sql/sqlite/queries.sql",
    "rocket_rides/cli.py",
):
    if needed not in names:
        problems.append(f"the wheel lacks {needed}")
for dialect in ("postgres", "sqlite"):
    if not any(n.startswith(f"idempotence/sql/{dialect}/migrations/0001_") for n in names):
        problems.append(f"the wheel lacks the {dialect} migrations")
if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
    problems.append("the wheel lacks the LICENSE file")
if metadata["License-Expression"] != "Apache-2.0":
    problems.append(f"License-Expression is {metadata['License-Expression']!r}")
classifiers = metadata.get_all("Classifier") or []
for needed in ("Typing :: Typed", "Programming Language :: Python :: 3.11"):
    if needed not in classifiers:
        problems.append(f"no classifier {needed!r}")
for field in ("Summary", "Requires-Python", "Description-Content-Type"):
    if not metadata[field]:
        problems.append(f"no {field} in the metadata")
members = {m.split("/", 1)[-1] for m in tarfile.open(sdist).getnames()}
for needed in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "tests/conftest.py"):
    if needed not in members:
        problems.append(f"the sdist lacks {needed}")
if problems:
    sys.exit("\n".join(problems))
print(f"{len(names)} files in the wheel; {len(classifiers)} classifiers; metadata complete")
EOF

say "installing the wheel with the demo extra into a fresh virtual environment"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --progress-bar off "$wheel[demo]"

# Outside the checkout, with no database URL of the caller's: SQLite in the directory.
run_dir="$work/run"
mkdir "$run_dir"
env_cmd=(env -u IDEMPOTENCE_DATABASE_URL -u PYTHONPATH)

say "idempotence demo, small and seeded"
(cd "$run_dir" && "${env_cmd[@]}" "$work/venv/bin/idempotence" demo \
    --rides 20 --clients 4 --workers 1 --seed 1)

say "the key-store example"
# The documentation's key-store example: the first Python block that defines
# create_charge, in the docs pages first, then in README.md (the docs test runs it
# from the checkout; here it runs against the installed wheel).
"$python" - "$root" "$run_dir/keystore_example.py" <<'EOF'
import re
import sys
from pathlib import Path

root, out = Path(sys.argv[1]), Path(sys.argv[2])
blocks = [
    block
    for page in [*sorted((root / "docs").rglob("*.md")), root / "README.md"]
    for block in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S)
    if "def create_charge(" in block and "open_store(" in block
]
if not blocks:
    sys.exit("no key-store example (a Python block defining create_charge) in the docs")
out.write_text(blocks[0])
EOF
(cd "$run_dir" && "${env_cmd[@]}" "$work/venv/bin/python" keystore_example.py)
echo "the key-store example ran"
