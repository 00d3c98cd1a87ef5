"""The CI instruction guard's judgement (benchmarks/instruction_guard.py), on made-up
numbers: no valgrind and no database, only the rule that fails CI. A row fails when it
grew more than 10 % over the committed baseline, and passes at 10 % or less (or when it
shrank); every row is printed either way. The guard measuring for real is
tests/test_benchmarks.py's (slow tier) and .ci/run's "instruction guard" step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def guard() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "instruction_guard", BENCHMARKS / "instruction_guard.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("instruction_guard", module)
    spec.loader.exec_module(module)
    return module


BASELINE = {"postgres handler": 200_000.0, "redis replay": 50_000.0}


@pytest.mark.parametrize("growth", [1.0, 0.9, 1.05, 1.10])
def test_a_row_within_10_percent_passes(guard: ModuleType, growth: float):
    now = {row: value * growth for row, value in BASELINE.items()}
    verdicts = guard.compare(BASELINE, now, guard.LIMIT)
    assert [v.failed for v in verdicts] == [False, False]


@pytest.mark.parametrize("growth", [1.1001, 1.15, 2.0])
def test_a_row_past_10_percent_fails(guard: ModuleType, growth: float):
    now = {"postgres handler": BASELINE["postgres handler"] * growth, "redis replay": 50_000.0}
    verdicts = guard.compare(BASELINE, now, guard.LIMIT)
    assert [(v.row, v.failed) for v in verdicts] == [
        ("postgres handler", True),
        ("redis replay", False),
    ]


def test_a_row_without_a_baseline_fails(guard: ModuleType):
    # A new row gets its number by an explicit, reviewed --update, never silently.
    (verdict,) = guard.compare(BASELINE, {"sqlite handler": 1.0}, guard.LIMIT)
    assert verdict.failed and verdict.change is None


def test_rows_not_measured_are_not_judged(guard: ModuleType):
    # --backend redis compares the Redis rows alone.
    verdicts = guard.compare(BASELINE, {"redis replay": 50_000.0}, guard.LIMIT)
    assert [v.row for v in verdicts] == ["redis replay"]


def test_the_table_prints_every_row_with_its_change(guard: ModuleType):
    now = {"postgres handler": 230_000.0, "redis replay": 49_000.0}
    lines = guard.table(guard.compare(BASELINE, now, guard.LIMIT)).splitlines()
    assert lines[0].split() == ["row", "baseline", "now", "change"]
    assert lines[1].split()[:6] == ["postgres", "handler", "200,000", "230,000", "+15.00", "%"]
    assert "FAILED" in lines[1]
    assert lines[2].split()[:6] == ["redis", "replay", "50,000", "49,000", "-2.00", "%"]
    assert "FAILED" not in lines[2]


def test_update_writes_the_rows_and_what_produced_them(guard: ModuleType, tmp_path: Path):
    path = tmp_path / "instructions.json"
    path.write_text(json.dumps({"rows": {"redis replay": 7, "postgres handler": 1}}))
    args = argparse.Namespace(requests=100, warmup=30)
    guard.write_baseline(path, {"postgres handler": 1234.6, "sqlite handler": 99.0}, args)
    written = json.loads(path.read_text())
    # Measured rows are replaced (rounded), a backend not measured keeps its row, and
    # the rows come in the guard's order, so that a diff of the file reads row by row.
    assert written["rows"] == {"postgres handler": 1235, "sqlite handler": 99, "redis replay": 7}
    assert list(written["rows"]) == ["postgres handler", "sqlite handler", "redis replay"]
    assert written["produced"]["requests"] == 100
    assert {"python", "valgrind", "psycopg", "sqlite"} <= set(written["produced"])


def test_the_committed_baseline_has_every_row(guard: ModuleType):
    rows = guard.read_baseline(guard.BASELINE)
    assert set(rows) == set(guard.ROWS)
    assert all(value > 0 for value in rows.values())
    produced = json.loads(guard.BASELINE.read_text())["produced"]
    assert produced["command"].endswith("--update")
