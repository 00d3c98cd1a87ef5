"""The soak run (benchmarks/soak.py): its verdict on made-up runs, and a real quick run
on each backend.

The verdict's functions are pure, so each kind of growth is fed to them as a series of
samples that has it (and one that has only noise, which must pass); the quick runs
check that the script really starts the demo stack, follows its processes through
restarts, sees the reaper delete keys, and cleans up after itself.
"""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from tests.support.postgres import ProvidedServer

#: The slow tier: soak runs under crashes.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "soak.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


soak = _load()
LIMITS = soak.Limits(
    warm_up=60.0, rss_mb_per_hour=60.0, fd_per_hour=60.0, key_life=140.0, first_reap=90.0
)
RATE = 30  # rides per second


def run(
    *,
    seconds: float = 600.0,
    rss: Callable[[float], float] = lambda t: 0.0,
    fds: Callable[[float], float] = lambda t: 0.0,
    connections: Callable[[float], float] = lambda t: 0.0,
    rows: Callable[[float], float] | None = None,
    pid: Callable[[float], int] = lambda t: 100,
) -> list[Any]:
    """Samples every 5 s of a healthy run, plus whatever the callables add: noise on
    every series, a steady worker and an API worker whose pid is ``pid(t)``."""
    rng = random.Random(7)
    samples = []
    for step in range(int(seconds / 5) + 1):
        t = step * 5.0
        rides = int(RATE * t)
        # A reaped table holds about the rides of the last retention + a pass.
        held = min(rides, RATE * 70) if rows is None else int(rows(t))
        api = [pid(t), int((50 + rss(t) + rng.uniform(-0.5, 0.5)) * 1e6), 20 + int(fds(t))]
        worker = [200, int((55 + rng.uniform(-0.5, 0.5)) * 1e6), 12 + rng.randint(-1, 1)]
        samples.append(
            soak.Sample(
                t=t,
                processes={"api-1": api, "worker": worker},
                connections=20 + rng.randint(-3, 3) + int(connections(t)),
                key_rows=held,
                key_bytes=held * 600,
                rides=rides,
            )
        )
    return samples


def verdict(samples: list[Any], **totals: Any) -> list[str]:
    result: list[str] = soak.failures(samples, soak.Totals(**totals), LIMITS)
    return result


def test_a_healthy_run_passes():
    assert verdict(run()) == []


def test_growing_memory_fails():
    # 100 MB an hour: what 1 KB per request at 30 requests a second leaks.
    failed = verdict(run(rss=lambda t: t * 100 / 3600))
    assert len(failed) == 1 and failed[0].startswith("api-1: RSS grows"), failed


def test_memory_that_stops_growing_after_the_warm_up_passes():
    assert verdict(run(rss=lambda t: min(t, 60.0) / 6)) == []


def test_a_restarted_process_is_not_judged_on_memory():
    # Every fresh fork starts small and grows: across pids that is no leak.
    failed = verdict(run(rss=lambda t: (t % 50) / 5, pid=lambda t: 100 + int(t // 50)))
    assert failed == []
    rows = {row["process"]: row for row in soak.process_rows(run(pid=lambda t: int(t)), LIMITS)}
    assert not rows["api-1"]["judged"] and rows["worker"]["judged"]


def test_leaking_file_descriptors_fail():
    failed = verdict(run(fds=lambda t: t / 30))
    assert len(failed) == 1 and failed[0].startswith("api-1: file descriptors grow 1"), failed


def test_leaking_database_connections_fail():
    failed = verdict(run(connections=lambda t: t / 30))
    assert len(failed) == 1 and failed[0].startswith("database connections grow"), failed


def test_a_key_table_the_reaper_does_not_keep_down_fails():
    failed = verdict(run(rows=lambda t: RATE * t))
    assert any("above its bound" in f for f in failed), failed
    assert any("the reaper deleted nothing" in f for f in failed), failed


def test_a_reaper_that_falls_behind_fails():
    # Keys live twice as long as they may: the bound catches it before the run ends.
    failed = verdict(run(rows=lambda t: min(RATE * t, RATE * 2.5 * LIMITS.key_life)))
    assert len(failed) == 1 and "above its bound" in failed[0], failed


@pytest.mark.parametrize("status", [500, 502, 503])
def test_any_5xx_fails(status: int):
    failed = verdict(run(), statuses={201: 10_000, status: 1})
    assert failed == [f"5xx answers: {{{status}: 1}}"]


def test_wrong_answers_fail():
    failed = verdict(run(), unexpected=["demo-x-00001: 422 ..."], replay_mismatches=["k"])
    assert len(failed) == 2


def test_growth_over_a_short_window_is_not_judged():
    # 30 s of samples: an hour's slope from them would be noise times 120.
    assert verdict(run(seconds=30.0, rss=lambda t: t, fds=lambda t: t)) == []


# -- real runs ------------------------------------------------------------------------------


def _quick(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == (0 if result["passed"] else 1)
    return result


def _check(result: dict[str, Any]) -> None:
    assert result["passed"], result["failures"]
    samples = result["samples"]
    assert len(samples) >= 10
    names = {"supervisor", "provider", "api-1", "api-2", "api-3", "worker"}
    assert set(samples[-1]["processes"]) == names
    # Workers were killed, and the samples followed them under their new pids.
    assert result["crashes"] >= 1
    rows = {row["process"]: row for row in result["processes"]}
    assert rows["api-2"]["pids"] + rows["api-3"]["pids"] > 2
    assert rows["api-1"]["pids"] == 1  # the steady worker got no crash order
    # The reaper deleted keys: the table holds fewer than the rides booked.
    assert 0 < samples[-1]["key_rows"] < samples[-1]["rides"]
    assert result["totals"]["requests"] > 100
    assert result["minutes"][0]["answers"] > 100


def test_quick_soak_on_sqlite():
    _check(_quick("--backend", "sqlite"))


def test_quick_soak_on_postgres(pg_server: ProvidedServer):
    result = _quick("--backend", "postgres", "--postgres", pg_server.url)
    _check(result)
    assert all(s["connections"] > 0 for s in result["samples"])
    with psycopg.connect(pg_server.url) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = %s",
            (result["settings"]["database"],),
        ).fetchall()
    assert left == []


def test_a_key_table_whose_bytes_grow_fails():
    samples = run()
    for sample in samples:
        sample.key_bytes = int(2e6 + sample.t * 100e6 / 3600)  # dead rows never reclaimed
    failed = verdict(samples)
    assert len(failed) == 1 and failed[0].startswith("key table: its bytes grow"), failed
    # Where nothing can reclaim them (autovacuum off), bytes are reported, not judged.
    unjudged = soak.Limits(**{**LIMITS.__dict__, "judge_key_bytes": False})
    assert soak.failures(samples, soak.Totals(), unjudged) == []
