#!/usr/bin/env bash
# Install what the HTTP, peer and driver benchmarks need beyond the test extra, once:
#   * benchmarks/requirements.txt into benchmarks/.deps (never the package's own
#     environment; the scripts put that directory at the END of sys.path), stamped with
#     the file's SHA-256 so that a changed requirements.txt asks for this again;
#   * wrk, the load generator (C), and valgrind (callgrind counts instructions for
#     benchmarks/instruction_guard.py, CI's guard), with apt-get when missing (as root).
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

# need TOOL WHAT: TOOL on the PATH, or installed with apt-get (as root), or a failure.
need() {
    local tool=$1 what=$2
    if command -v "$tool" >/dev/null; then
        echo "$tool: $(command -v "$tool")"
    elif command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
        echo "$tool: installing (apt-get install -y $tool)"
        apt-get install -y -q "$tool" >/dev/null ||
            { apt-get update -q >/dev/null && apt-get install -y -q "$tool" >/dev/null; }
        command -v "$tool"
    else
        echo "$tool ($what) is missing: install it with your package manager" >&2
        exit 1
    fi
}

need wrk "the load generator, in C"
need valgrind "callgrind counts the instruction guard's instructions"
valgrind --version
