"""F4 on the example flow: SIGKILL at every boundary, on PostgreSQL and SQLite, then
recover by retry and by resume. Zero duplicate charges, zero duplicate rows, every key
finished, the same response on every later retry (``crash_test`` asserts all of it
and raises on any violation; these tests also check that it really killed)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from idempotence import KeyState, open_async_store
from idempotence.flows import ResultKind
from idempotence.testing import FakeProvider, Recovery, crash_test
from idempotence.testing.example import ride_request, rides_flow
from tests.flows.test_engine import EXAMPLE_EVENTS

#: The slow tier: the crash harness kills workers at every boundary.
pytestmark = pytest.mark.slow

EXAMPLE = "idempotence.testing.example:crash_target"

#: The example's boundaries, with the provider's own commit inside the charge.
KILL_POINTS = [
    *EXAMPLE_EVENTS[:3],
    "provider:charge:before_commit",
    "provider:charge:after_commit",
    *EXAMPLE_EVENTS[3:],
]


def config(database_url: str, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "database": database_url,
        "provider": str(tmp_path / "provider.sqlite3"),
        "lock_timeout": 0.4,
        **extra,
    }


def test_f4_the_example_flow_survives_a_kill_at_every_boundary(
    database_url: str, tmp_path: Path
) -> None:
    report = crash_test(EXAMPLE, config(database_url, tmp_path))
    print(report)
    assert [str(point) for point in report.points] == KILL_POINTS
    assert report.baseline_census == {
        "rides": 1,
        "ride_audit": 2,
        "idempotence_staged_jobs": 1,
        "provider charges": 1,
    }
    assert len(report.results) == 2 * len(KILL_POINTS)
    assert {r.recovery for r in report.results} == {Recovery.RETRY, Recovery.RESUME}
    for result in report.results:
        assert result.killed, result
        assert (result.state, result.status, result.duplicates) == (KeyState.COMPLETE, 201, {})


def test_f4_a_declined_card_survives_a_kill_at_every_boundary(
    sqlite_flows_path: str, tmp_path: Path
) -> None:
    cfg = config("sqlite:///" + sqlite_flows_path, tmp_path, card="tok_declined")
    report = crash_test(EXAMPLE, cfg)
    # The flow ends in the charge's recording phase: no charge_created phase.
    assert [str(point) for point in report.points] == KILL_POINTS[:-2]
    assert report.baseline_census["provider charges"] == 1
    assert report.baseline_census["idempotence_staged_jobs"] == 0
    assert all(r.killed and (r.state, r.status) == (KeyState.FAILED, 402) for r in report.results)


def test_r6_the_non_idempotent_example_never_charges_twice_whatever_the_kill(
    sqlite_flows_path: str, tmp_path: Path
) -> None:
    cfg = config("sqlite:///" + sqlite_flows_path, tmp_path, idempotent=False)
    report = crash_test(EXAMPLE, cfg, recoveries=(Recovery.RETRY,))
    assert report.baseline_census["provider requests"] == 1
    errored = {str(r.point) for r in report.results if r.state is KeyState.ERRORED}
    # Killed between the checkpoint that sets calling and the recording phase's commit:
    # the outcome of the charge is unknown to the flow, so the key waits for a human
    # (R6) ...
    assert errored == {
        "call:charge:before",
        "provider:charge:before_commit",
        "provider:charge:after_commit",
        "call:charge:after",
        "phase:ride_created:before_commit",
    }
    # ... and everywhere else the flow completes. Never a second request (census).
    assert all(r.state is KeyState.COMPLETE for r in report.results if str(r.point) not in errored)


def test_f4_the_example_flow_survives_kills_under_run_async(
    database_url: str, tmp_path: Path
) -> None:
    commits = {p for p in KILL_POINTS if p.endswith("commit")}
    report = crash_test(
        EXAMPLE,
        config(database_url, tmp_path),
        flavour="async",
        recoveries=(Recovery.RETRY,),
        select=lambda point: point.event in commits,
    )
    assert {str(point) for point in report.points} == commits
    assert all(r.killed and r.state is KeyState.COMPLETE for r in report.results)


def test_the_example_flow_runs_with_run_async(
    database_url: str, tmp_path: Path, scope: str
) -> None:
    provider = FakeProvider(tmp_path / "provider.sqlite3")
    flow = rides_flow(provider)
    req = ride_request(flow, scope=scope, key="k")

    async def main() -> tuple[Any, Any]:
        store = open_async_store(database_url)
        try:
            return await flow.run_async(store, req), await flow.run_async(store, req)
        finally:
            await store.close()

    first, replay = asyncio.run(main())
    assert first.kind is ResultKind.EXECUTED and first.response.status == 201
    assert (replay.kind, replay.response) == (ResultKind.REPLAYED, first.response)
    ride = json.loads(first.response.body)
    [charge] = provider.charges(reference=f"{scope}/k")
    assert (ride["status"], ride["charge_id"], ride["amount"]) == ("charged", charge.id, 2000)
