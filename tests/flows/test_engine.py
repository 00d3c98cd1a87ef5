"""The flow engine on every store: R1 (the loop over recovery points), F1 (a lost lock
ends the run as LOST), R4 (derived keys) and the observer the crash harness uses (F4)."""

from __future__ import annotations

import gc
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from idempotence import FINISHED, ConfigurationError, LockLost, Outcome, SqliteStore
from idempotence.flows import Advance, Flow, NoOp, ResultKind
from idempotence.stores.postgres import PostgresStore
from idempotence.testing import FakeProvider
from idempotence.testing.example import create_tables, ride_request, rides_flow
from tests.flows.support import FlowRunner, finish, noting, request

SHORT = timedelta(milliseconds=250)

#: Every boundary of the example flow, in order.
EXAMPLE_EVENTS = [
    "phase:started:before_commit",
    "phase:started:after_commit",
    "call:charge:before",
    "call:charge:after",
    "phase:ride_created:before_commit",
    "phase:ride_created:after_commit",
    "phase:charge_created:before_commit",
    "phase:charge_created:after_commit",
]


# -- R1: the loop ---------------------------------------------------------------------------


def test_r1_noop_commits_its_writes_pauses_and_resumes(runner: FlowRunner, scope: str) -> None:
    answers = iter([NoOp(), NoOp(), finish()])
    flow = Flow("r1-noop")
    flow.phase("started")(noting("poll", lambda ctx: next(answers)))

    for polls in (1, 2):
        result = runner.run(flow, request(flow, scope))
        assert result.response is not None
        assert (result.kind, result.response.status, result.stored) == (
            ResultKind.PAUSED,
            202,
            False,
        )
        record = runner.get(scope)
        assert record is not None and not record.finished
        assert (record.recovery_point, record.locked_at) == ("started", None)
        assert runner.notes(scope) == ["poll"] * polls  # each pause kept its writes

    final = runner.run(flow, request(flow, scope))
    assert final.kind is ResultKind.EXECUTED
    assert runner.notes(scope) == ["poll"] * 3


def test_r1_an_unknown_recovery_point_fails_clearly_and_keeps_the_key(
    runner: FlowRunner, scope: str
) -> None:
    flow = Flow("r1-unknown")
    flow.phase("started")(noting("a", lambda ctx: finish()))
    # A key left at a point this version of the flow no longer has (a removed step).
    lease = runner.store.claim(request(flow, scope)).lease
    with runner.store.transaction() as tx:
        lease = runner.store.checkpoint(tx, lease, "vanished_step")
    runner.store.release(lease)

    result = runner.run(flow, request(flow, scope))
    assert (result.kind, result.stored) == (ResultKind.FAILED, False)
    assert isinstance(result.error, ConfigurationError)
    assert "'r1-unknown'" in str(result.error) and "'vanished_step'" in str(result.error)
    record = runner.get(scope)
    assert record is not None
    # Kept, unlocked, where it was: a deployment that has the step can still resume it.
    assert (record.recovery_point, record.locked_at, record.finished) == (
        "vanished_step",
        None,
        False,
    )
    assert runner.notes(scope) == []


@pytest.mark.parametrize("target", ["nowhere", FINISHED])
def test_r1_an_advance_to_a_point_without_a_step_is_refused_before_it_commits(
    runner: FlowRunner, scope: str, target: str
) -> None:
    flow = Flow("r1-advance")
    flow.phase("started")(noting("a", lambda ctx: Advance(target)))
    result = runner.run(flow, request(flow, scope))
    assert result.kind is ResultKind.FAILED
    assert isinstance(result.error, ConfigurationError) and repr(target) in str(result.error)
    if target == FINISHED:
        assert "Finish(response)" in str(result.error)
    record = runner.get(scope)
    assert record is not None and record.recovery_point == "started" and not record.finished
    assert runner.notes(scope) == []  # the phase rolled back: the key is not stranded


def polling_flow(calls: list[str], answers: list[Any]) -> Flow:
    """A non-idempotent status call whose recording phase pauses until told to finish."""
    flow = Flow("r1-poll")
    flow.phase("started")(noting("order", lambda ctx: Advance("poll")))

    def status(ctx: Any) -> str:
        calls.append("status")
        return "pending"

    flow.foreign(
        "poll",
        name="status",
        call=status,
        record=noting("polled", lambda ctx: answers.pop(0)),
        idempotent=False,
    )
    return flow


def test_r6_names_with_a_tilde_are_plain_names(runner: FlowRunner, scope: str) -> None:
    """Nothing is parsed out of a recovery point any more (the call begun is its own
    column), so '~' is an ordinary character of flow names and points."""
    calls: list[str] = []
    flow = Flow("r6~tilde")
    flow.phase("started")(lambda ctx: Advance("charge~calling:x"))
    flow.foreign(
        "charge~calling:x",
        name="charge",
        call=lambda ctx: calls.append(ctx.key_for("charge")),
        record=lambda ctx, _: finish(),
        idempotent=False,
    )
    with pytest.raises(ConfigurationError):
        Flow("")
    result = runner.run(flow, request(flow, scope))
    assert result.kind is ResultKind.EXECUTED
    assert len(calls) == 1 and calls[0].startswith("r6~tilde-")


def test_r1_a_noop_after_a_non_idempotent_call_resumes_at_the_step_not_errored(
    runner: FlowRunner, scope: str
) -> None:
    # The call returned and its result was recorded: pausing there must not leave the
    # key's calling set, which the next attempt would read as a crash mid-call (R6).
    calls: list[str] = []
    flow = polling_flow(calls, [NoOp(), finish()])
    paused = runner.run(flow, request(flow, scope))
    assert paused.kind is ResultKind.PAUSED
    record = runner.get(scope)
    assert record is not None and (record.recovery_point, record.calling) == ("poll", None)
    done = runner.run(flow, request(flow, scope))
    assert done.kind is ResultKind.EXECUTED
    assert calls == ["status", "status"]
    assert runner.notes(scope) == ["order", "polled", "polled"]


def test_r6_an_observer_aborting_after_a_non_idempotent_call_errors_the_key(
    runner: FlowRunner, scope: str
) -> None:
    # Aborting the run once the call returned (what the harness does, short of a kill)
    # must not pass for a determinate failure: that would make the call again.
    def observer(event: str) -> None:
        if event == "call:status:after":
            raise RuntimeError("aborted right after the call")

    calls: list[str] = []
    flow = polling_flow(calls, [finish()])
    result = runner.run(flow, request(flow, scope), observer=observer)
    assert (result.kind, result.stored) == (ResultKind.ERRORED, True)
    assert runner.run(flow, request(flow, scope)).kind is ResultKind.REPLAYED
    assert calls == ["status"]


# -- F1: a lost lock ends the run ----------------------------------------------------------


def test_f1_a_takeover_during_a_foreign_call_makes_the_recording_phase_lost(
    runner: FlowRunner, scope: str
) -> None:
    taken: list[Any] = []
    flow = Flow("f1-lost", lock_timeout=SHORT)

    def slow_call(ctx: Any) -> str:
        time.sleep(SHORT.total_seconds() + 0.15)  # a GC pause, a slow network
        other = runner.open_other()  # another worker, with a store of its own
        try:
            taken.append(other.claim(request(flow, scope)))
        finally:
            other.close()
        return "late"

    flow.phase("started")(noting("ride", lambda ctx: Advance("charge")))
    flow.foreign(
        "charge", name="charge", call=slow_call, record=noting("zombie", lambda c: finish())
    )
    result = runner.run(flow, request(flow, scope))

    assert (result.kind, result.response, result.stored) == (ResultKind.LOST, None, False)
    assert isinstance(result.error, LockLost)
    assert taken[0].outcome is Outcome.EXECUTE and taken[0].lease.token == 2
    assert runner.notes(scope) == ["ride"]  # the zombie's recording phase rolled back
    record = runner.get(scope)
    assert record is not None and record.lock_token == 2 and not record.finished


def test_f1_a_takeover_between_a_noop_commit_and_its_release_still_pauses(
    runner: FlowRunner, scope: str
) -> None:
    # The phase committed; by the time the worker unlocks, another has taken the key
    # over. That worker resumes it, which is all the release was for: no LockLost
    # escapes from run().
    flow = Flow("f1-noop", lock_timeout=SHORT)
    flow.phase("started")(noting("poll", lambda ctx: NoOp()))
    taken: list[Any] = []

    def stall_after_commit(event: str) -> None:
        if event == "phase:started:after_commit":
            time.sleep(SHORT.total_seconds() + 0.15)
            other = runner.open_other()
            try:
                taken.append(other.claim(request(flow, scope)))
            finally:
                other.close()

    result = runner.run(flow, request(flow, scope), observer=stall_after_commit)
    assert result.kind is ResultKind.PAUSED
    assert taken[0].outcome is Outcome.EXECUTE
    record = runner.get(scope)
    assert record is not None and record.lock_token == 2 and record.locked_at is not None
    assert runner.notes(scope) == ["poll"]


def test_f1_a_takeover_during_a_phase_refuses_its_commit_on_postgres(
    pg_flows_url: str, scope: str
) -> None:
    # On PostgreSQL another worker can take the key over while a phase's transaction is
    # open; the fenced checkpoint then refuses the commit. (SQLite's single writer
    # cannot be overtaken mid-phase: see test_zombie.py.)
    flow = Flow("f1-lost-in-phase", lock_timeout=SHORT)
    taken: list[Any] = []

    def slow(ctx: Any) -> Any:
        time.sleep(SHORT.total_seconds() + 0.15)
        with PostgresStore(pg_flows_url) as other:
            taken.append(other.claim(request(flow, scope)))
        return finish()

    flow.phase("started")(noting("zombie write", slow))
    with PostgresStore(pg_flows_url) as store:
        result = flow.run(store, request(flow, scope))
        assert result.kind is ResultKind.LOST
        assert taken[0].outcome is Outcome.EXECUTE
        with store.transaction() as tx:
            notes = tx.execute("SELECT note FROM flow_notes WHERE scope = %(s)s", {"s": scope})
        assert notes == []


# -- R4: derived keys ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "backend",
    [
        "postgres",
        "sqlite",
    ],
)
def test_r4_derived_keys_are_never_reused_after_a_key_row_is_deleted(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, scope: str
) -> None:
    if backend == "postgres":
        store: Any = PostgresStore(request.getfixturevalue("pg_flows_url"))
    else:
        store = SqliteStore(request.getfixturevalue("sqlite_flows_path"))
    provider = FakeProvider(tmp_path / "provider.sqlite3")
    flow = rides_flow(provider, name="r4-reuse")
    try:
        first = flow.run(store, ride_request(flow, scope=scope, key="k1"))
        assert first.kind is ResultKind.EXECUTED and first.claim is not None
        # What the reaper does once the key's retention is over (B3).
        with store.transaction() as tx:
            tx.execute("DELETE FROM idempotency_keys WHERE scope = :s", {"s": scope})
        second = flow.run(store, ride_request(flow, scope=scope, key="k2"))
        assert second.claim is not None
        reused = flow.key_for(second.claim.record.id, "charge")
        assert reused != flow.key_for(first.claim.record.id, "charge"), (
            f"a new key row got the deleted one's derived key {reused!r}; the provider "
            f"answered {second.kind.value}: {second.error!r}"
        )
        assert second.kind is ResultKind.EXECUTED
        assert len({charge.idempotency_key for charge in provider.charges()}) == 2
    finally:
        store.close()


# -- F4: the observer ------------------------------------------------------------------------


def test_f4_the_observer_is_told_every_boundary_in_order(
    runner: FlowRunner, provider: FakeProvider, scope: str
) -> None:
    flow = rides_flow(provider)
    events: list[str] = []
    result = runner.run(flow, ride_request(flow, scope=scope, key="k"), observer=events.append)
    assert result.kind is ResultKind.EXECUTED
    assert events == EXAMPLE_EVENTS
    events.clear()
    replay = runner.run(flow, ride_request(flow, scope=scope, key="k"), observer=events.append)
    assert replay.kind is ResultKind.REPLAYED and events == []


@pytest.mark.parametrize("moment", ["before_commit", "after_commit"])
def test_f4_phase_events_are_on_their_side_of_the_commit(
    runner: FlowRunner, provider: FakeProvider, scope: str, moment: str
) -> None:
    # An observer that raises is a crash at that exact point (short of killing the
    # process): before the commit, the phase is gone; after it, the phase stands.
    def observer(event: str) -> None:
        if event == f"phase:started:{moment}":
            raise RuntimeError(f"crash at {event}")

    flow = rides_flow(provider)
    result = runner.run(flow, ride_request(flow, scope=scope, key="k"), observer=observer)
    assert result.kind is ResultKind.FAILED
    record = runner.get(scope)
    assert record is not None
    rides = runner.rows("SELECT id FROM rides WHERE scope = :scope", {"scope": scope})
    if moment == "before_commit":
        assert (record.recovery_point, len(rides)) == ("started", 0)
    else:
        assert (record.recovery_point, len(rides)) == ("ride_created", 1)


def test_a_coroutine_phase_on_a_sync_store_fails_clearly(
    sqlite_flows_path: str, scope: str
) -> None:
    flow = Flow("sync-with-async-phase")

    @flow.phase("started")
    async def phase(ctx: Any) -> Any:
        return finish()

    with SqliteStore(sqlite_flows_path) as store, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = flow.run(store, request(flow, scope))
        gc.collect()
    assert result.kind is ResultKind.FAILED
    assert isinstance(result.error, ConfigurationError) and "run_async" in str(result.error)
    assert not [w for w in seen if "never awaited" in str(w.message)]


def test_example_tables_can_be_created_twice(sqlite_flows_path: str, scope: str) -> None:
    # Again on tables that hold rows (the fixture made them once already): nothing
    # fails, and nothing of what they hold is lost.
    insert = (
        "INSERT INTO rides (scope, origin, destination, amount, status)"
        " VALUES (:scope, 'a', 'b', 100, 'created')"
    )
    count = "SELECT count(*) AS n FROM rides WHERE scope = :scope"
    with SqliteStore(sqlite_flows_path) as store:
        with store.transaction() as tx:
            tx.execute(insert, {"scope": scope})
        create_tables(store)
        with store.transaction() as tx:
            assert tx.execute(count, {"scope": scope}) == [{"n": 1}]
