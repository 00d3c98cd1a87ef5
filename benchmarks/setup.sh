#!/usr/bin/env bash
# Install what the HTTP, peer and driver benchmarks need beyond the test extra, once:
#   * benchmarks/requirements.txt into benchmarks/.deps (never the package's own
#     environment; the scripts put that directory at the END of sys.path), stamped with
#     the file's SHA-256 so that a changed requirements.txt asks for this again;
#   * wrk, the load generator (C), with apt-get when it is missing (as root).
# The benchmarks (and tests/test_benchmarks.py) never install anything: they stop with a
# line naming this script. .ci/run runs it before the tests.
#
#   bash benchmarks/setup.sh            # with .venv/bin/python, or PYTHON=...
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
python=${PYTHON:-../.venv/bin/python}
[[ -x $python ]] || python=$(command -v python3)

wanted=$(sha256sum requirements.txt | cut -d' ' -f1)
if [[ -f .deps/.requirements.sha256 && $(cat .deps/.requirements.sha256) == "$wanted" ]]; then
    echo "benchmarks/.deps: up to date"
else
    echo "benchmarks/.deps: installing requirements.txt"
    rm -rf .deps
    "$python" -m pip install -q --disable-pip-version-check --no-deps --target .deps \
        -r requirements.txt
    echo "$wanted" >.deps/.requirements.sha256
fi

if command -v wrk >/dev/null; then
    echo "wrk: $(command -v wrk)"
elif command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    echo "wrk: installing (apt-get install -y wrk)"
    apt-get install -y -q wrk >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q wrk >/dev/null; }
    command -v wrk
else
    echo "wrk (the load generator, in C) is missing: install it with your package manager" >&2
    exit 1
fi
