"""The benchmark scripts start as the README runs them (``python benchmarks/X.py``).

Run as a script, a file's directory comes first on ``sys.path``: a benchmark named
like a standard-library module (it was ``http.py``) would shadow it for every import
of the library, and the README's commands would fail before measuring anything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).parent.parent / "benchmarks").glob("*.py"))


def test_there_are_benchmarks():
    assert {path.name for path in BENCHMARKS} >= {
        "store.py",
        "reaper.py",
        "http_bench.py",
        "soak.py",
    }


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.name)
def test_a_benchmark_script_starts(script: Path):
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
