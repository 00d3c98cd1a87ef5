"""B2: the completer resumes abandoned keys through their flows, from every recovery
point, without a second effect; gives up after N attempts; leaves unknown flows alone.

Each test that takes ``flavour`` runs on the sync completer and on the async one it is
generated from (F7); the async completer also resumes flows written with coroutine
phases and foreign calls, which the sync one cannot."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from idempotence import ClaimRequest, KeyState, StoredResponse, key_state
from idempotence.flows import (
    Advance,
    Finish,
    Flow,
    FlowRegistry,
    NoOp,
    PhaseContext,
    ResultKind,
)
from idempotence.maintenance import (
    AsyncCompleter,
    Completer,
    CompleterConfig,
    CompletionOutcome,
    Signals,
)
from idempotence.problems import Problem, ProblemDetails
from tests.maintenance.checkout import Faults, async_checkout_flow, setup
from tests.maintenance.support import EXPIRED, Backend, Flavour, in_threads, new_scope, pending

NOW = CompleterConfig(grace=timedelta(0), batch_pause=0.0, interval=0.05)


def run_until_fault(flow: Flow, db: Backend, scope: str, key: str) -> None:
    result = flow.run(db.store, flow.request(scope=scope, key=key, fingerprint="f" * 64))
    assert result.kind is ResultKind.FAILED, result


def test_b2_resumes_keys_left_at_every_recovery_point_without_a_second_effect(
    db: Backend, flavour: Flavour
) -> None:
    faults, flow, registry = setup(db)
    scope = new_scope()
    left_at = {
        "create_order": "started",  # the first phase rolled back
        "charge_call": "order_created",  # the call failed before reaching the provider
        "record_charge": "order_created",  # the provider charged; the record rolled back
        "finish": "charged",  # the last phase rolled back
    }
    for step, point in left_at.items():
        faults.arm(step, [step])
        run_until_fault(flow, db, scope, step)
        record = db.store.get(scope, step)
        assert record is not None and record.recovery_point == point, step
        assert key_state(record, record.created_at) is KeyState.PENDING
    # A worker that died holding the lock, at 'charged': its lock has expired.
    faults.arm("finish", ["crashed"])
    run_until_fault(flow, db, scope, "crashed")
    db.store.claim(
        ClaimRequest(
            scope=scope, key="crashed", fingerprint="f" * 64, flow="checkout", lock_timeout=EXPIRED
        )
    )
    time.sleep(0.02)

    result = flavour(Completer, NOW, flows=registry).run_once()

    keys = [*left_at, "crashed"]
    assert sorted(c.key for c in result.completions) == sorted(keys)
    assert {c.outcome for c in result.completions} == {CompletionOutcome.COMPLETED}
    for key in keys:
        record = db.store.get(scope, key)
        assert record is not None and record.response is not None
        assert record.response.status == 201, key
    assert db.count("orders") == len(keys)  # one order per key
    assert db.count("orders", "charge IS NULL") == 0
    charges = {r["derived_key"]: r["calls"] for r in db.execute("SELECT * FROM provider_charges")}
    assert len(charges) == len(keys)  # one charge per key: the provider's dedup held
    # Only the key whose charge was made but not recorded called twice, with the same
    # derived key.
    record_charge = db.store.get(scope, "record_charge")
    assert record_charge is not None
    assert charges.pop(flow.key_for(record_charge.id, "charge")) == 2
    assert set(charges.values()) == {1}
    assert db.count("idempotence_staged_jobs") == len(keys)  # one receipt each


def test_b2_a_key_whose_flow_keeps_failing_is_left_for_a_human(
    db: Backend, flavour: Flavour
) -> None:
    registry, scope = FlowRegistry(), new_scope()
    broken = registry.register(Flow("broken"))

    @broken.phase("started")
    def explode(ctx: PhaseContext) -> Advance:
        raise ValueError("the flow has a bug")

    first = broken.run(db.store, broken.request(scope=scope, key="k", fingerprint="f" * 64))
    assert first.kind is ResultKind.FAILED
    config = CompleterConfig(grace=timedelta(0), max_attempts=3)
    outcomes = [
        flavour(Completer, config, flows=registry).run_once().completions[0].outcome
        for _ in range(3)
    ]
    assert outcomes == [
        CompletionOutcome.FAILED,
        CompletionOutcome.FAILED,
        CompletionOutcome.GAVE_UP,
    ]
    record = db.store.get(scope, "k")
    assert record is not None and record.error is not None
    assert "3 attempt(s)" in record.error and "the flow has a bug" in record.error
    assert key_state(record, record.created_at) is KeyState.ERRORED
    # F6: the give-up is stored neutral with a code of its own, for any wire profile.
    assert record.response is not None
    details = ProblemDetails.from_stored(record.response)
    assert details is not None and details.problem is Problem.REQUEST_ABANDONED
    # Errored keys are never picked again.
    assert flavour(Completer, config, flows=registry).run_once().completions == ()


def test_b2_attempts_are_counted_durably(db: Backend, flavour: Flavour) -> None:
    """A completer that died mid-attempt never reported back; its attempt counts."""
    faults, flow, registry = setup(db)
    scope = new_scope()
    faults.arm("finish", ["k"])
    run_until_fault(flow, db, scope, "k")
    db.execute(
        "UPDATE idempotency_keys SET completer_attempts = 5 WHERE scope = %(s)s", {"s": scope}
    )

    result = flavour(Completer, NOW, flows=registry).run_once()

    assert [(c.outcome, c.attempts) for c in result.completions] == [(CompletionOutcome.GAVE_UP, 5)]
    assert db.count("orders", "charge IS NOT NULL") == 1  # nothing ran again


def test_b2_a_key_of_an_unregistered_flow_is_reported_not_touched(
    db: Backend, flavour: Flavour
) -> None:
    scope = new_scope()
    pending(db.store, scope, "orphan", flow="ghost")
    before = db.row(scope, "orphan")

    result = flavour(Completer, NOW, flows=FlowRegistry()).run_once()

    assert result.unregistered == {"ghost": 1}
    assert result.completions == ()
    assert db.row(scope, "orphan") == before


def test_b2_leaves_live_locks_and_keys_within_the_grace_period(
    db: Backend, flavour: Flavour
) -> None:
    faults, flow, registry = setup(db)
    scope = new_scope()
    faults.arm("finish", ["recent"])
    run_until_fault(flow, db, scope, "recent")
    db.store.claim(flow.request(scope=scope, key="running", fingerprint="f" * 64))

    graceful = CompleterConfig(grace=timedelta(hours=1))
    assert flavour(Completer, graceful, flows=registry).run_once().completions == ()
    # Without a grace period the unlocked key goes; the live lock still stays.
    result = flavour(Completer, NOW, flows=registry).run_once()
    assert [c.key for c in result.completions] == ["recent"]


def test_b2_empty_database_is_a_no_op(db: Backend, flavour: Flavour) -> None:
    _, _, registry = setup(db)
    result = flavour(Completer, NOW, flows=registry).run_once()
    assert (result.completions, result.unregistered, result.batches) == ((), {}, 1)


def test_b2_works_in_batches_until_a_short_page(db: Backend, flavour: Flavour) -> None:
    faults, flow, registry = setup(db)
    scope = new_scope()
    keys = [f"k{i}" for i in range(25)]
    faults.arm("finish", keys)
    for key in keys:
        run_until_fault(flow, db, scope, key)
    signals = Signals()
    sizes: list[int] = []
    signals.on("completer.batch", lambda payload: sizes.append(payload[1]))
    config = CompleterConfig(grace=timedelta(0), batch_size=10, batch_pause=0.0)

    result = flavour(Completer, config, flows=registry, signals=signals).run_once()

    assert sizes == [10, 10, 5]
    assert result.batches == 3
    assert result.completed == 25


def test_b2_two_completers_at_once_never_resume_a_key_twice(db: Backend, flavour: Flavour) -> None:
    faults, flow, registry = setup(db)
    scope = new_scope()
    keys = [f"k{i}" for i in range(30)]
    faults.arm("finish", keys)
    for key in keys:
        run_until_fault(flow, db, scope, key)
    # The pick moves last_run_at to now, so with a grace period a key one completer
    # picked is not old enough for the other: that is what keeps them apart. (With no
    # grace at all a key may be attempted twice; the claim still runs it once.)
    db.backdate(scope, None, timedelta(seconds=1.1), "created_at", "last_run_at")
    config = CompleterConfig(grace=timedelta(seconds=1), batch_size=4, batch_pause=0.0)
    one = flavour(Completer, config, flows=registry, node=True)
    two = flavour(Completer, config, flows=registry, node=True)

    results = in_threads(one.run_once, two.run_once)

    attempted = [c.key for r in results for c in r.completions]
    assert sorted(attempted) == sorted(keys)  # each key by exactly one completer
    assert {c.outcome for r in results for c in r.completions} == {CompletionOutcome.COMPLETED}
    assert db.execute("SELECT DISTINCT calls FROM provider_charges") == [{"calls": 1}]
    assert db.execute("SELECT DISTINCT completer_attempts FROM idempotency_keys") == [
        {"completer_attempts": 1}
    ]


def test_b2_run_forever_completes_keys_and_stops(db: Backend, flavour: Flavour) -> None:
    faults, flow, registry = setup(db)
    scope = new_scope()
    signals, stop = Signals(), threading.Event()
    completer = flavour(Completer, NOW, flows=registry, signals=signals)
    thread = threading.Thread(target=completer.run_forever, args=(stop,))
    thread.start()
    try:
        faults.arm("finish", ["k"])
        run_until_fault(flow, db, scope, "k")
        deadline = time.monotonic() + 10
        while not (record := db.store.get(scope, "k")) or not record.finished:
            assert time.monotonic() < deadline, "the running completer never finished the key"
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_b2_a_flow_that_pauses_is_not_counted_as_failing(db: Backend, flavour: Flavour) -> None:
    """A phase that returns NoOp (waiting for something) made progress: its attempts
    start again, so it is never given up on for waiting."""
    registry, scope = FlowRegistry(), new_scope()
    waiting = registry.register(Flow("waiting"))
    ready = threading.Event()

    @waiting.phase("started")
    def wait_for_it(ctx: PhaseContext) -> NoOp | Finish:
        return Finish(StoredResponse.of(200)) if ready.is_set() else NoOp()

    waiting.run(db.store, waiting.request(scope=scope, key="k", fingerprint="f" * 64))
    config = CompleterConfig(grace=timedelta(0), max_attempts=2)
    for _ in range(4):
        (completion,) = flavour(Completer, config, flows=registry).run_once().completions
        assert completion.outcome is CompletionOutcome.PAUSED
    ready.set()
    (completion,) = flavour(Completer, config, flows=registry).run_once().completions
    assert completion.outcome is CompletionOutcome.COMPLETED


# -- F7: an async application's flows ---------------------------------------------------


def async_setup(db: Backend) -> tuple[Faults, Flow, FlowRegistry]:
    faults, _, registry = setup(db)  # the tables, and the sync flow under its own name
    flow = registry.register(async_checkout_flow(db, faults))
    return faults, flow, registry


def test_b2_f7_the_async_completer_resumes_flows_with_coroutine_phases_and_calls(
    db: Backend,
) -> None:
    """An async application registers its one flow (coroutine phases, a coroutine
    foreign call); the async completer resumes its abandoned keys from every recovery
    point to their terminal state, with no second effect."""
    faults, flow, registry = async_setup(db)
    store, scope = db.open_async(), new_scope()
    left_at = {
        "create_order": "started",
        "charge_call": "order_created",
        "record_charge": "order_created",
        "finish": "charged",
    }
    for step, point in left_at.items():
        faults.arm(step, [step])
        request = flow.request(scope=scope, key=step, fingerprint="f" * 64)
        result = db.loop.run(flow.run_async(store, request))
        assert result.kind is ResultKind.FAILED, result
        record = db.store.get(scope, step)
        assert record is not None and record.recovery_point == point, step

    done = db.loop.run(AsyncCompleter(store, NOW, flows=registry).run_once())

    assert sorted(c.key for c in done.completions) == sorted(left_at)
    assert {c.outcome for c in done.completions} == {CompletionOutcome.COMPLETED}
    for key in left_at:
        record = db.store.get(scope, key)
        assert record is not None and record.finished, key
        assert record.response is not None and record.response.status == 201, key
    assert db.count("orders") == len(left_at)
    assert db.count("orders", "charge IS NULL") == 0
    charges = {r["derived_key"]: r["calls"] for r in db.execute("SELECT * FROM provider_charges")}
    record_charge = db.store.get(scope, "record_charge")
    assert record_charge is not None
    assert charges.pop(flow.key_for(record_charge.id, "charge")) == 2  # same derived key
    assert set(charges.values()) == {1}
    assert db.count("idempotence_staged_jobs") == len(left_at)


def test_b2_f7_the_sync_completer_cannot_resume_a_coroutine_flow(db: Backend) -> None:
    """Why the async completer exists: the sync one refuses a coroutine phase, so the
    key fails the attempt and stays unfinished."""
    faults, flow, registry = async_setup(db)
    scope = new_scope()
    faults.arm("finish", ["k"])
    request = flow.request(scope=scope, key="k", fingerprint="f" * 64)
    assert db.loop.run(flow.run_async(db.open_async(), request)).kind is ResultKind.FAILED

    (completion,) = Completer(db.store, NOW, flows=registry).run_once().completions

    assert completion.outcome is CompletionOutcome.FAILED
    assert completion.error is not None and "coroutine" in completion.error.lower()
    record = db.store.get(scope, "k")
    assert record is not None and not record.finished
