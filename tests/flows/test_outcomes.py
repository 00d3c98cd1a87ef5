"""R4, R5 and R6 by number: every way a run of a flow can end, on every store.

Each test runs on PostgreSQL and SQLite, sync (``run``) and async (``run_async``),
against real databases and the fake provider's own SQLite file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from idempotence import KeyState, key_state
from idempotence.flows import (
    SERVER_ERROR,
    Advance,
    Flow,
    Indeterminate,
    Reject,
    ResultKind,
    problem,
)
from idempotence.problems import Problem, ProblemDetails
from idempotence.testing import (
    FakeProvider,
    Fault,
    KillPoint,
    ProviderError,
    load_target,
    settle,
    spawn_worker,
)
from idempotence.testing.example import ride_request, rides_flow
from tests.flows.support import OTHER_FP, FlowRunner, finish, noting, raising, request

EXAMPLE = "idempotence.testing.example:crash_target"


def charges_of(provider: FakeProvider, scope: str) -> list[Any]:
    return provider.charges(reference=f"{scope}/k")


# -- R5: terminal answers are stored ------------------------------------------------------


def test_r5_a_declined_card_is_a_stored_402_that_replays(
    runner: FlowRunner, provider: FakeProvider, scope: str
) -> None:
    flow = rides_flow(provider)
    req = ride_request(flow, scope=scope, key="k", card="tok_declined")
    result = runner.run(flow, req)
    assert result.response is not None
    assert (result.kind, result.response.status, result.stored) == (ResultKind.EXECUTED, 402, True)
    record = runner.get(scope)
    assert record is not None and record.finished_at is not None
    assert key_state(record, record.finished_at) is KeyState.FAILED

    replay = runner.run(flow, req)
    assert replay.kind is ResultKind.REPLAYED and replay.response == result.response
    charges = charges_of(provider, scope)
    assert [charge.status for charge in charges] == ["declined"]
    assert provider.received(reference=f"{scope}/k") == 1  # the replay never reached it
    rides = runner.rows(
        "SELECT status, charge_id FROM rides WHERE scope = :scope", {"scope": scope}
    )
    assert rides == [{"status": "declined", "charge_id": charges[0].id}]


def test_r5_an_unexpected_exception_rolls_back_unlocks_and_answers_an_unstored_500(
    runner: FlowRunner, scope: str
) -> None:
    failures = [RuntimeError("the phase blew up")]

    def second(ctx: Any) -> Any:
        if failures:
            raise failures.pop()
        return finish()

    flow = Flow("r5-crash")
    flow.phase("started")(noting("first", lambda ctx: Advance("second")))
    flow.phase("second")(noting("second", second))

    result = runner.run(flow, request(flow, scope))
    assert (result.kind, result.response, result.stored) == (ResultKind.FAILED, SERVER_ERROR, False)
    assert isinstance(result.error, RuntimeError)
    record = runner.get(scope)
    assert record is not None
    assert (record.recovery_point, record.locked_at, record.finished) == ("second", None, False)
    assert runner.notes(scope) == ["first"]  # the failed phase's write rolled back with it

    again = runner.run(flow, request(flow, scope))
    assert again.kind is ResultKind.EXECUTED
    assert again.claim is not None and again.claim.lease is not None
    assert again.claim.lease.recovery_point == "second"  # resumed, not started over
    assert runner.notes(scope) == ["first", "second"]  # 'started' ran once


def test_r5_store_server_errors_stores_the_500(runner: FlowRunner, scope: str) -> None:
    flow = Flow("r5-store-500", store_server_errors=True)
    flow.phase("started")(noting("doomed", raising(RuntimeError("boom"))))
    result = runner.run(flow, request(flow, scope))
    assert (result.kind, result.response, result.stored) == (ResultKind.FAILED, SERVER_ERROR, True)

    replay = runner.run(flow, request(flow, scope))
    assert (replay.kind, replay.response) == (ResultKind.REPLAYED, SERVER_ERROR)
    record = runner.get(scope)
    assert record is not None and record.finished and record.error is None
    assert runner.notes(scope) == []  # stored or not, the phase itself rolled back


def test_r5_a_reject_before_the_first_commit_stores_nothing_and_frees_the_key(
    runner: FlowRunner, provider: FakeProvider, scope: str
) -> None:
    flow = rides_flow(provider)
    bad = ride_request(flow, scope=scope, key="k", amount=-5)
    result = runner.run(flow, bad)
    assert result.response is not None
    assert (result.kind, result.response.status, result.stored) == (ResultKind.REJECTED, 422, False)
    assert runner.get(scope) is None
    assert runner.rows("SELECT id FROM rides WHERE scope = :scope", {"scope": scope}) == []
    assert provider.received(reference=f"{scope}/k") == 0

    # The same key with a corrected request: a different fingerprint, yet no MISMATCH.
    good = ride_request(flow, scope=scope, key="k", amount=2000)
    assert good.fingerprint != bad.fingerprint
    fixed = runner.run(flow, good)
    assert fixed.kind is ResultKind.EXECUTED
    assert fixed.response is not None and fixed.response.status == 201


def test_r5_a_reject_after_a_commit_is_stored(runner: FlowRunner, scope: str) -> None:
    flow = Flow("r5-late-reject")
    flow.phase("started")(noting("kept", lambda ctx: Advance("check")))
    conflict = problem(409, "Conflict", "the seat was taken meanwhile")
    flow.phase("check")(noting("dropped", raising(Reject(conflict))))

    result = runner.run(flow, request(flow, scope))
    assert (result.kind, result.response, result.stored) == (ResultKind.EXECUTED, conflict, True)
    replay = runner.run(flow, request(flow, scope))
    assert (replay.kind, replay.response) == (ResultKind.REPLAYED, conflict)
    assert runner.notes(scope) == ["kept"]
    # The key is spent: another request under it is a mismatch, not a fresh start.
    other = runner.run(flow, request(flow, scope, fingerprint=OTHER_FP))
    assert other.kind is ResultKind.MISMATCH


def test_r5_a_reject_after_a_foreign_call_at_started_is_stored_not_forgotten(
    runner: FlowRunner, provider: FakeProvider, scope: str
) -> None:
    # The call took effect before the rejection. Forgetting the key (as for a
    # validation error) would let a "corrected" request create a new key row, with a
    # new derived key, and charge again.
    flow = Flow("r5-reject-after-call")

    def charge(ctx: Any) -> Any:
        key = ctx.key_for("charge")
        return provider.charge(500, "tok_visa", idempotency_key=key, reference=f"{scope}/k")

    def record(ctx: Any, charge: Any) -> Any:
        raise Reject(problem(422, "Amount Too Small", "refunding is up to support"))

    flow.foreign("started", name="charge", call=charge, record=record)
    result = runner.run(flow, request(flow, scope))
    assert result.response is not None
    assert (result.kind, result.response.status, result.stored) == (ResultKind.EXECUTED, 422, True)
    assert runner.get(scope) is not None

    corrected = runner.run(flow, request(flow, scope, fingerprint=OTHER_FP))
    assert corrected.kind is ResultKind.MISMATCH
    assert len(charges_of(provider, scope)) == 1


# -- R4: an idempotent call is repeated with the same key -----------------------------------


def test_r4_an_idempotent_call_that_timed_out_is_resumed_with_the_same_key(
    runner: FlowRunner, provider: FakeProvider, scope: str
) -> None:
    flow = rides_flow(provider)
    provider.fail_next(Fault.TIMEOUT_AFTER_COMMIT)  # charged, but we never heard
    req = ride_request(flow, scope=scope, key="k")
    first = runner.run(flow, req)
    assert (first.kind, first.stored) == (ResultKind.FAILED, False)
    assert isinstance(first.error, TimeoutError)

    second = runner.run(flow, req)
    assert second.kind is ResultKind.EXECUTED
    record = runner.get(scope)
    assert record is not None
    derived = f"rides-{record.id}-charge"
    assert provider.received(idempotency_key=derived) == 2
    assert [charge.idempotency_key for charge in charges_of(provider, scope)] == [derived]


# -- R6: a non-idempotent call is never repeated blindly -------------------------------------


@pytest.mark.parametrize(
    "fault", [Fault.TIMEOUT_AFTER_COMMIT, Fault.RESET_AFTER_COMMIT, Fault.RESET_BEFORE_COMMIT]
)
def test_r6_an_indeterminate_failure_of_a_non_idempotent_call_errors_the_key(
    runner: FlowRunner, provider: FakeProvider, scope: str, fault: Fault
) -> None:
    flow = rides_flow(provider, idempotent=False)
    provider.fail_next(fault)
    req = ride_request(flow, scope=scope, key="k")
    result = runner.run(flow, req)
    assert result.response is not None
    assert (result.kind, result.response.status, result.stored) == (ResultKind.ERRORED, 502, True)
    assert isinstance(result.error, TimeoutError | ConnectionError)
    record = runner.get(scope)
    assert record is not None and record.finished_at is not None
    assert record.error is not None and "'charge'" in record.error
    assert "indeterminate" in record.error
    assert key_state(record, record.finished_at) is KeyState.ERRORED
    # F6: stored neutral with a code of its own; the HTTP profile renders it.
    assert record.response is not None
    details = ProblemDetails.from_stored(record.response)
    assert details is not None and details.problem is Problem.OUTCOME_UNKNOWN

    for _ in range(2):
        replay = runner.run(flow, req)
        assert (replay.kind, replay.response) == (ResultKind.REPLAYED, result.response)
    assert provider.received(reference=f"{scope}/k") == 1  # never asked again


def test_r6_a_call_raising_indeterminate_errors_the_key(runner: FlowRunner, scope: str) -> None:
    calls: list[str] = []

    def publish(ctx: Any) -> Any:
        calls.append(ctx.key_for("publish"))
        raise Indeterminate("the broker closed the channel before confirming")

    flow = Flow("r6-indeterminate")
    flow.phase("started")(noting("order", lambda ctx: Advance("publish")))
    flow.foreign(
        "publish",
        name="publish",
        call=publish,
        record=noting("x", lambda ctx: finish()),
        idempotent=False,
    )
    result = runner.run(flow, request(flow, scope))
    assert (result.kind, result.stored) == (ResultKind.ERRORED, True)
    assert isinstance(result.error, Indeterminate)
    record = runner.get(scope)
    assert record is not None and record.error is not None and "'publish'" in record.error
    assert runner.run(flow, request(flow, scope)).kind is ResultKind.REPLAYED
    assert len(calls) == 1
    assert runner.notes(scope) == ["order"]


def test_r6_a_determinate_failure_of_a_non_idempotent_call_can_be_retried(
    runner: FlowRunner, provider: FakeProvider, scope: str
) -> None:
    flow = rides_flow(provider, idempotent=False)
    provider.fail_next(Fault.SERVER_ERROR)  # a 500 that charged nothing
    req = ride_request(flow, scope=scope, key="k")
    first = runner.run(flow, req)
    assert (first.kind, first.response, first.stored) == (ResultKind.FAILED, SERVER_ERROR, False)
    assert isinstance(first.error, ProviderError) and first.error.status == 500
    record = runner.get(scope)
    assert record is not None
    # The attempt is taken back: the next attempt may call again.
    assert (record.recovery_point, record.calling, record.locked_at) == (
        "ride_created",
        None,
        None,
    )

    second = runner.run(flow, req)
    assert second.kind is ResultKind.EXECUTED
    assert second.response is not None and second.response.status == 201
    assert provider.received(reference=f"{scope}/k") == 2
    assert len(charges_of(provider, scope)) == 1


@pytest.mark.parametrize("boundary", ["before_commit", "after_commit"])
def test_r6_a_worker_killed_during_a_non_idempotent_call_errors_the_key_never_calls_twice(
    database_url: str, tmp_path: Path, scope: str, boundary: str
) -> None:
    config = {
        "database": database_url,
        "provider": str(tmp_path / "provider.sqlite3"),
        "lock_timeout": 0.3,
        "idempotent": False,
    }
    worker = spawn_worker(
        EXAMPLE,
        config,
        scope=scope,
        key="k",
        workdir=tmp_path / "worker",
        kill_at=KillPoint(f"provider:charge:{boundary}"),
    )
    worker.wait(60)
    assert worker.killed, worker.stderr()

    target = load_target(EXAMPLE, config)
    store = target.open_store()
    try:
        # The key names its step's own point, and the call in a column of its own.
        died = store.get(scope, "k")
        assert died is not None and died.finished_at is None
        assert (died.recovery_point, died.calling) == ("ride_created", "charge")
        result, _ = settle(lambda: target.flow.run(store, target.request(scope, "k")), timeout=30)
        assert result.kind is ResultKind.ERRORED
        record = store.get(scope, "k")
        assert record is not None and record.error is not None
        assert "a worker died during the call" in record.error
        assert (record.recovery_point, record.calling) == ("finished", None)
        again = target.flow.run(store, target.request(scope, "k"))
        assert (again.kind, again.response) == (ResultKind.REPLAYED, result.response)
    finally:
        store.close()
    provider = FakeProvider(config["provider"])
    assert provider.received(reference=f"{scope}/k") == 1
    assert len(charges_of(provider, scope)) == (1 if boundary == "after_commit" else 0)
