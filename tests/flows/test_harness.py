"""The crash harness judges truthfully (F4): broken flows fail it, with a message that
says where and what; and its plumbing (targets, workers) fails loudly when misused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from idempotence.flows import ResultKind
from idempotence.testing import (
    KillPoint,
    Recovery,
    crash_test,
    load_target,
    spawn_worker,
)

#: The slow tier: the crash harness kills workers at every boundary.
pytestmark = pytest.mark.slow

BROKEN = "tests.flows.targets:broken_target"
EXAMPLE = "idempotence.testing.example:crash_target"


def config(database_url: str, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "database": database_url,
        "provider": str(tmp_path / "provider.sqlite3"),
        "lock_timeout": 0.3,
        **extra,
    }


def only(*events: str) -> Any:
    return lambda point: point.event in events


def test_f4_the_harness_catches_a_foreign_call_without_a_derived_key(
    sqlite_flows_path: str, tmp_path: Path
) -> None:
    report = crash_test(
        BROKEN,
        config("sqlite:///" + sqlite_flows_path, tmp_path, mistake="random_key"),
        recoveries=(Recovery.RETRY,),
        select=only("call:charge:before", "provider:charge:after_commit"),
        check=False,
    )
    by_point = {r.point.event: r for r in report.results}
    # Killed before the call: nothing to repeat, nothing doubled.
    assert by_point["call:charge:before"].ok
    # Killed after the provider committed: the retry charged again, under a new key.
    doubled = by_point["provider:charge:after_commit"]
    assert doubled.killed and doubled.duplicates == {"provider charges": (1, 2)}
    assert any("provider charges: 2 where a clean run leaves 1" in v for v in doubled.violations)


def test_f4_the_harness_catches_a_local_write_outside_a_phase_and_says_so(
    sqlite_flows_path: str, tmp_path: Path
) -> None:
    with pytest.raises(AssertionError) as failed:
        crash_test(
            BROKEN,
            config("sqlite:///" + sqlite_flows_path, tmp_path, mistake="write_in_call"),
            recoveries=(Recovery.RESUME,),
            select=only("provider:charge:before_commit"),
        )
    message = str(failed.value)
    assert "1 exactly-once violation" in message
    assert "kill at provider:charge:before_commit, then resume" in message
    assert "ride_audit: 4 where a clean run leaves 3 (duplicate)" in message


def test_f4_a_worker_that_never_reaches_its_kill_point_finishes_normally(
    sqlite_flows_path: str, tmp_path: Path, scope: str
) -> None:
    worker = spawn_worker(
        EXAMPLE,
        config("sqlite:///" + sqlite_flows_path, tmp_path),
        scope=scope,
        key="k",
        workdir=tmp_path / "w",
        kill_at=KillPoint("phase:nowhere:before_commit"),
    )
    assert worker.wait(60) == 0 and not worker.killed
    result = worker.result()
    assert result is not None and result.kind is ResultKind.EXECUTED
    assert [point.event for point in worker.events()][:2] == [
        "phase:started:before_commit",
        "phase:started:after_commit",
    ]


def test_f4_a_target_factory_is_named_module_colon_function(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="module:function"):
        load_target("idempotence.testing.example.crash_target", {})
    with pytest.raises(TypeError, match="not a Target"):
        load_target("builtins:dict", {})
