"""The transaction tests: phases in the application's transaction (R2), fencing of
checkpoints and deferred finishes (F1), request-as-transaction (F3), and transactions
kept past their block; for stores with `Capability.TRANSACTIONS`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from ...errors import LockLost, TransactionEnded
from ...states import STARTED, Outcome
from ...stores.capabilities import Capability
from ._support import (
    EXPIRED,
    FP,
    OTHER_FP,
    SHORT,
    Clock,
    make_side_table,
    request,
    requires,
    response,
    side_notes,
    write_note,
)

# -- P5 ----------------------------------------------------------------------------------


@requires(Capability.TRANSACTIONS)
def test_p5_an_unlocked_key_resumes_from_its_recovery_point(store: Any, scope: str) -> None:
    lease = store.claim(request(scope)).lease
    with store.transaction() as tx:
        lease = store.checkpoint(tx, lease, "ride_created")
    store.release(lease)  # an unexpected exception after the phase (R5)
    claim = store.claim(request(scope))
    assert claim.outcome is Outcome.EXECUTE
    assert claim.lease.recovery_point == "ride_created"
    assert claim.lease.token == 2


@requires(Capability.TRANSACTIONS)
def test_r6_calling_is_set_by_its_checkpoint_and_cleared_by_every_other_write(
    store: Any, scope: str
) -> None:
    """The checkpoint before a non-idempotent call names it; the claim after a crash
    hands it back on the lease, with the step's own point; any other checkpoint, and
    the finish, clear it."""
    lease = store.claim(request(scope)).lease
    with store.transaction() as tx:
        lease = store.checkpoint(tx, lease, "charging", calling="charge")
    assert (lease.recovery_point, lease.calling) == ("charging", "charge")
    record = store.get(scope, "key-1")
    assert (record.recovery_point, record.calling) == ("charging", "charge")
    store.release(lease)  # the worker died during the call
    lease = store.claim(request(scope)).lease
    assert (lease.recovery_point, lease.calling, lease.token) == ("charging", "charge", 2)

    with store.transaction() as tx:
        lease = store.checkpoint(tx, lease, "charging")  # a determinate failure
    assert lease.calling is None and store.get(scope, "key-1").calling is None
    with store.transaction() as tx:
        lease = store.checkpoint(tx, lease, "charging", calling="charge")
    with store.transaction() as tx:  # the recording phase's checkpoint
        lease = store.checkpoint(tx, lease, "charged")
    assert lease.calling is None and store.get(scope, "key-1").calling is None
    with store.transaction() as tx:
        lease = store.checkpoint(tx, lease, "charged", calling="refund")
    store.finish(lease, response(1))
    record = store.get(scope, "key-1")
    assert (record.recovery_point, record.calling) == ("finished", None)


@requires(Capability.TRANSACTIONS)
def test_f1_a_zombie_cannot_set_calling(store: Any, scope: str, clock: Clock) -> None:
    zombie = store.claim(request(scope, lock_timeout=SHORT)).lease
    clock.pass_lock(scope, "key-1", EXPIRED)
    taker = store.claim(request(scope)).lease
    with pytest.raises(LockLost), store.transaction() as tx:
        store.checkpoint(tx, zombie, "charging", calling="charge")
    record = store.get(scope, "key-1")
    assert (record.recovery_point, record.calling, record.lock_token) == (
        STARTED,
        None,
        taker.token,
    )


# -- scoping, times, records -------------------------------------------------------------


# -- F1 fencing ------------------------------------------------------------------------


@requires(Capability.TRANSACTIONS)
def test_f1_a_zombie_cannot_commit_after_a_takeover(store: Any, scope: str, clock: Clock) -> None:
    make_side_table(store)
    zombie = store.claim(request(scope, lock_timeout=SHORT)).lease
    clock.pass_lock(scope, "key-1", EXPIRED)  # the zombie's lock expires (GC pause...)
    taker = store.claim(request(scope)).lease
    assert taker is not None and taker.token == zombie.token + 1

    # The zombie wakes up and tries to commit a phase: refused, its writes roll back.
    with pytest.raises(LockLost), store.transaction() as tx:
        write_note(tx, scope, "zombie phase")
        store.checkpoint(tx, zombie, "ride_created")
    with pytest.raises(LockLost), store.transaction() as tx:
        write_note(tx, scope, "zombie finish")
        store.finish(zombie, response(666), tx=tx)
    for fenced in (store.finish, store.release, store.heartbeat):
        args = (zombie, response(666)) if fenced == store.finish else (zombie,)
        with pytest.raises(LockLost):
            fenced(*args)
    assert side_notes(store, scope) == []

    # The rightful holder is untouched and finishes normally.
    with store.transaction() as tx:
        write_note(tx, scope, "taker phase")
        taker = store.checkpoint(tx, taker, "ride_created")
    store.finish(taker, response(2))
    assert side_notes(store, scope) == ["taker phase"]
    replay = store.claim(request(scope))
    assert replay.outcome is Outcome.REPLAY and replay.response == response(2)
    record = store.get(scope, "key-1")
    assert (record.recovery_point, record.lock_token) == ("finished", 2)


@requires(Capability.TRANSACTIONS)
def test_f1_a_finished_key_refuses_a_checkpoint(store: Any, scope: str) -> None:
    lease = store.claim(request(scope)).lease
    store.finish(lease, response(1))
    with pytest.raises(LockLost), store.transaction() as tx:
        store.checkpoint(tx, lease, "again")
    assert store.claim(request(scope)).response == response(1)


# -- F2 heartbeats ---------------------------------------------------------------------


@requires(Capability.TRANSACTIONS)
def test_checkpoint_refreshes_the_lock(store: Any, scope: str, clock: Clock) -> None:
    lease = store.claim(request(scope, lock_timeout=timedelta(milliseconds=600))).lease
    clock.pass_lock(scope, "key-1", timedelta(milliseconds=400))
    with store.transaction() as tx:
        store.checkpoint(tx, lease, "charged")
    clock.pass_lock(scope, "key-1", timedelta(milliseconds=400))
    # 800 ms after the claim, 400 ms after the checkpoint: the lock still holds.
    assert store.claim(request(scope)).outcome is Outcome.IN_PROGRESS


# -- phases share the application's transaction (R2) -----------------------------------


@requires(Capability.TRANSACTIONS)
def test_r2_a_failed_phase_rolls_back_its_writes_and_its_checkpoint(store: Any, scope: str) -> None:
    make_side_table(store)
    lease = store.claim(request(scope)).lease
    with pytest.raises(RuntimeError), store.transaction() as tx:
        write_note(tx, scope, "half")
        store.checkpoint(tx, lease, "ride_created")
        raise RuntimeError("crash before commit")
    assert side_notes(store, scope) == []
    assert store.get(scope, "key-1").recovery_point == STARTED


@requires(Capability.TRANSACTIONS)
def test_r2_the_checkpoint_commits_with_the_phase(store: Any, scope: str) -> None:
    make_side_table(store)
    lease = store.claim(request(scope)).lease
    with store.transaction() as tx:
        write_note(tx, scope, "ride")
        lease = store.checkpoint(tx, lease, "ride_created")
    assert side_notes(store, scope) == ["ride"]
    assert store.get(scope, "key-1").recovery_point == "ride_created"


# -- F3: a transaction that opens with its claim and commits with its finish ----------


@requires(Capability.TRANSACTIONS)
def test_f3_a_transaction_opened_with_a_claim_commits_claim_writes_and_response_together(
    store: Any, scope: str
) -> None:
    make_side_table(store)
    with store.transaction(claim=request(scope)) as tx:
        assert tx.claim.outcome is Outcome.EXECUTE and tx.claim.lease.token == 1
        write_note(tx, scope, "ride")
        store.finish(tx.claim.lease, response(7), tx=tx, at_commit=True)
        # Deferred: the finish is the last statement, sent with the COMMIT.
        rows = tx.execute(
            "SELECT finished_at FROM idempotency_keys WHERE scope = :scope",
            {"scope": scope},
        )
        assert [row["finished_at"] for row in rows] == [None]
    assert side_notes(store, scope) == ["ride"]
    replay = store.claim(request(scope))
    assert replay.outcome is Outcome.REPLAY and replay.response == response(7)


@requires(Capability.TRANSACTIONS)
def test_f3_a_transaction_opened_on_a_finished_key_sees_the_replay(store: Any, scope: str) -> None:
    store.finish(store.claim(request(scope)).lease, response(3))
    with store.transaction(claim=request(scope)) as tx:
        assert tx.claim.outcome is Outcome.REPLAY and tx.claim.response == response(3)
    with store.transaction(claim=request(scope, fingerprint=OTHER_FP)) as tx:
        assert tx.claim.outcome is Outcome.MISMATCH


@requires(Capability.TRANSACTIONS)
def test_f3_a_failure_before_the_commit_rolls_back_the_claim_and_skips_the_finish(
    store: Any, scope: str
) -> None:
    make_side_table(store)
    with pytest.raises(RuntimeError), store.transaction(claim=request(scope)) as tx:
        write_note(tx, scope, "half")
        store.finish(tx.claim.lease, response(1), tx=tx, at_commit=True)
        raise RuntimeError("the handler crashed after finishing")
    assert side_notes(store, scope) == []
    assert store.get(scope, "key-1") is None  # R5: nothing stored, the key is free
    assert store.claim(request(scope)).outcome is Outcome.EXECUTE


@requires(Capability.TRANSACTIONS)
def test_f1_a_finish_at_commit_refused_by_the_fence_rolls_everything_back(
    store: Any, scope: str, clock: Clock
) -> None:
    make_side_table(store)
    zombie = store.claim(request(scope, lock_timeout=SHORT)).lease
    clock.pass_lock(scope, "key-1", EXPIRED)
    taker = store.claim(request(scope)).lease
    assert taker.token == zombie.token + 1
    # The refusal comes out of the transaction's exit, with the writes rolled back.
    with pytest.raises(LockLost), store.transaction() as tx:
        write_note(tx, scope, "zombie")
        store.finish(zombie, response(666), tx=tx, at_commit=True)
    assert side_notes(store, scope) == []
    store.finish(taker, response(2))
    assert store.claim(request(scope)).response == response(2)


@requires(Capability.TRANSACTIONS)
def test_finish_at_commit_needs_a_transaction(store: Any, scope: str) -> None:
    lease = store.claim(request(scope)).lease
    with pytest.raises(ValueError, match="tx="):
        store.finish(lease, response(1), at_commit=True)
    assert store.get(scope, "key-1").finished_at is None


# -- R2, F1: a transaction is usable inside its block only --------------------------------


STALE_USES = ["execute", "connection", "finish", "finish at commit", "checkpoint", "end_phase"]


def use_stale(store: Any, kept: Any, use: str, scope: str, lease: Any) -> None:
    """One use of ``kept``, a transaction whose block has ended."""
    if use == "execute":
        kept.execute(
            "INSERT INTO side_effects (scope, note) VALUES (:scope, :note)",
            {"scope": scope, "note": "stale"},
        )
    elif use == "connection":
        kept.connection  # noqa: B018 - the read is the use
    elif use == "finish":
        store.finish(lease, response(666), tx=kept)
    elif use == "finish at commit":
        store.finish(lease, response(666), tx=kept, at_commit=True)
    elif use == "checkpoint":
        store.checkpoint(kept, lease, "stale")
    elif use == "end_phase":
        store.end_phase(kept, lease, response=response(666))
    else:
        store.claim(request(scope, key="key-stale"), tx=kept)


@requires(Capability.TRANSACTIONS)
@pytest.mark.parametrize("use", [*STALE_USES, "claim"])
@pytest.mark.parametrize("ending", ["commit", "rollback", "commit with its claim"])
def test_r2_f1_a_transaction_kept_past_its_block_refuses_every_use(
    store: Any, scope: str, ending: str, use: str
) -> None:
    # Its connection is the store's again (on PostgreSQL the pool's, for another
    # request's transaction): a statement or a fenced write through it would join, or
    # be deferred to the COMMIT of, a transaction that is not its own.
    make_side_table(store)
    lease = store.claim(request(scope)).lease
    if ending == "commit":
        with store.transaction() as kept:
            write_note(kept, scope, "inside")
    elif ending == "rollback":
        with pytest.raises(RuntimeError), store.transaction() as kept:
            write_note(kept, scope, "rolled back")
            raise RuntimeError("the phase failed")
    else:
        with store.transaction(claim=request(scope, key="key-2")) as kept:
            write_note(kept, scope, "inside")
            store.finish(kept.claim.lease, response(2), tx=kept, at_commit=True)
    before = store.get(scope, "key-1")

    with pytest.raises(TransactionEnded, match="block has ended") as refused:
        use_stale(store, kept, use, scope, lease)
    assert "inside its `with` block" in str(refused.value)

    # Nothing of the stale call was written, now or at the next commit ...
    with store.transaction() as tx:
        write_note(tx, scope, "next")
        tx.execute("SELECT 1")
    expected = ["next"] if ending == "rollback" else ["inside", "next"]
    assert side_notes(store, scope) == expected
    assert store.get(scope, "key-1") == before
    assert store.get(scope, "key-stale") is None
    # ... and a new transaction works normally: the key's holder finishes it in one.
    with store.transaction() as tx:
        lease = store.checkpoint(tx, lease, "charged")
        store.finish(lease, response(3), tx=tx, at_commit=True)
    assert store.claim(request(scope)).response == response(3)


@requires(Capability.TRANSACTIONS)
@pytest.mark.parametrize("write", ["finish", "finish at commit", "checkpoint", "end_phase"])
def test_r2_f3_a_kept_transaction_whose_claim_was_given_its_response_says_it_ended(
    store: Any, scope: str, write: str
) -> None:
    # A fenced write of the key that such a claim finished is refused (LockLost) inside
    # the block; past the block, the stale transaction is the caller's bug and says so,
    # rather than a lost lock counted as one.
    with store.transaction(claim=request(scope), finished=response(2)) as kept:
        assert kept.claim.outcome is Outcome.EXECUTE
    with pytest.raises(TransactionEnded):
        use_stale(store, kept, write, scope, kept.claim.lease)
    assert store.claim(request(scope)).response == response(2)


@requires(Capability.TRANSACTIONS)
def test_r2_f3_a_replays_transaction_kept_past_its_block_refuses_it_too(
    store: Any, scope: str
) -> None:
    # A claim answered by a replay (on a cached store, from Redis, with no transaction
    # open at all) ends its block like any other.
    make_side_table(store)
    store.finish(store.claim(request(scope)).lease, response(1))
    with store.transaction(claim=request(scope)) as kept:
        assert kept.claim.outcome is Outcome.REPLAY
    for _ in range(2):  # for good, not once
        with pytest.raises(TransactionEnded):
            write_note(kept, scope, "stale")
    assert kept.claim.response == response(1)  # what it answered stays readable
    assert side_notes(store, scope) == []


# -- F3 with a fixed response: the claim writes the key finished --------------------------


def finished_row(tx: Any, scope: str) -> list[tuple[Any, ...]]:
    rows = tx.execute(
        "SELECT recovery_point, response_status, locked_at, finished_at"
        " FROM idempotency_keys WHERE scope = :scope",
        {"scope": scope},
    )
    keep = ("recovery_point", "response_status", "locked_at")
    return [(*(row[name] for name in keep), row["finished_at"] is None) for row in rows]


@requires(Capability.TRANSACTIONS)
def test_f3_a_claim_given_its_response_writes_the_key_finished_in_its_transaction(
    store: Any, scope: str
) -> None:
    make_side_table(store)
    with store.transaction(claim=request(scope), finished=response(7)) as tx:
        assert tx.claim.outcome is Outcome.EXECUTE and tx.claim.lease.token == 1
        write_note(tx, scope, "ride")
        # Already finished inside the transaction: nothing is left for the COMMIT.
        assert finished_row(tx, scope) == [("finished", 201, None, False)]
    assert side_notes(store, scope) == ["ride"]
    replay = store.claim(request(scope))
    assert replay.outcome is Outcome.REPLAY and replay.response == response(7)
    record = store.get(scope, "key-1")
    assert (record.recovery_point, record.lock_token, record.error) == ("finished", 1, None)
    assert record.locked_at is None and record.finished_at is not None
    # The retention runs from the finish, as a finish's does.
    assert record.expires_at - record.finished_at == timedelta(hours=24)
    with pytest.raises(LockLost):  # settled: no fenced write of the lease goes through
        store.finish(tx.claim.lease, response(8))


@requires(Capability.TRANSACTIONS)
def test_f3_a_claim_given_its_response_rolls_back_with_its_transaction(
    store: Any, scope: str
) -> None:
    make_side_table(store)
    fixed = response(1)
    with pytest.raises(RuntimeError), store.transaction(claim=request(scope), finished=fixed) as tx:
        write_note(tx, scope, "half")
        raise RuntimeError("the handler failed")
    assert side_notes(store, scope) == []
    assert store.get(scope, "key-1") is None  # R5: nothing stored, the key is free
    with store.transaction(claim=request(scope), finished=response(2)) as tx:
        assert tx.claim.outcome is Outcome.EXECUTE
    assert store.claim(request(scope)).response == response(2)


@requires(Capability.TRANSACTIONS)
def test_f3_a_claim_given_its_response_replays_a_finished_key_and_leaves_it(
    store: Any, scope: str
) -> None:
    store.finish(store.claim(request(scope)).lease, response(3))
    with store.transaction(claim=request(scope), finished=response(4)) as tx:
        assert tx.claim.outcome is Outcome.REPLAY and tx.claim.response == response(3)
    with store.transaction(claim=request(scope, fingerprint=OTHER_FP), finished=response(4)) as tx:
        assert tx.claim.outcome is Outcome.MISMATCH
    assert store.claim(request(scope)).response == response(3)


@requires(Capability.TRANSACTIONS)
def test_f3_f1_a_claim_given_its_response_takes_over_an_expired_lock_and_fences_its_holder(
    store: Any, scope: str, clock: Clock
) -> None:
    # A key left locked by a handler-mode run (or a crash): live, it is in progress and
    # untouched; expired, it is taken over with the next token and written finished.
    zombie = store.claim(request(scope, lock_timeout=SHORT)).lease
    with store.transaction(claim=request(scope), finished=response(5)) as tx:
        assert tx.claim.outcome is Outcome.IN_PROGRESS
    assert store.get(scope, "key-1").finished_at is None
    clock.pass_lock(scope, "key-1", EXPIRED)
    with store.transaction(claim=request(scope), finished=response(5)) as tx:
        assert tx.claim.outcome is Outcome.EXECUTE
        assert tx.claim.lease.token == zombie.token + 1
    for fenced in (store.finish, store.release, store.heartbeat):
        args = (zombie, response(666)) if fenced == store.finish else (zombie,)
        with pytest.raises(LockLost):
            fenced(*args)
    record = store.get(scope, "key-1")
    assert (record.lock_token, record.recovery_point, record.locked_at) == (2, "finished", None)
    assert store.claim(request(scope)).response == response(5)


@requires(Capability.TRANSACTIONS)
@pytest.mark.parametrize("write", ["finish at commit", "finish", "checkpoint", "end_phase"])
def test_f3_f1_a_fenced_write_after_a_claim_given_its_response_is_refused_at_the_call(
    store: Any, scope: str, write: str
) -> None:
    # The claim wrote the key finished: a finish or checkpoint of it would be refused by
    # the database (at the COMMIT, for a deferred finish, after the application's
    # statements). It is refused at the call instead, and everything rolls back.
    make_side_table(store)
    refusal = pytest.raises(LockLost, match=r"transaction\(finished=\.\.\.\)")
    with refusal as refused, store.transaction(claim=request(scope), finished=response(1)) as tx:
        write_note(tx, scope, "ride")
        lease = tx.claim.lease
        if write == "finish at commit":
            store.finish(lease, response(2), tx=tx, at_commit=True)
        elif write == "finish":
            store.finish(lease, response(2), tx=tx)
        elif write == "checkpoint":
            store.checkpoint(tx, lease, "charged")
        else:
            store.end_phase(tx, lease, response=response(2))
        pytest.fail("the write was not refused at the call")
    assert getattr(refused.value, "key", None) == "key-1"
    assert side_notes(store, scope) == []
    assert store.get(scope, "key-1") is None
    # Only that key's: another key's lease is finished in the same kind of transaction.
    other = store.claim(request(scope, key="key-2")).lease
    with store.transaction(claim=request(scope, key="key-3"), finished=response(1)) as tx:
        store.finish(other, response(3), tx=tx, at_commit=True)
    assert store.claim(request(scope, key="key-2")).response == response(3)
    assert store.claim(request(scope, key="key-3")).response == response(1)


@requires(Capability.TRANSACTIONS)
def test_f3_a_response_for_the_claim_needs_the_claim(store: Any, scope: str) -> None:
    with pytest.raises(ValueError, match="claim="), store.transaction(finished=response(1)):
        pass


@requires(Capability.TRANSACTIONS)
def test_f3_f1_a_takeover_given_its_response_that_rolls_back_leaves_the_key_as_it_was(
    store: Any, scope: str, clock: Clock
) -> None:
    holder = store.claim(request(scope, lock_timeout=SHORT)).lease
    clock.pass_lock(scope, "key-1", EXPIRED)
    before = store.get(scope, "key-1")
    fixed = response(5)
    with pytest.raises(RuntimeError), store.transaction(claim=request(scope), finished=fixed) as tx:
        assert tx.claim.outcome is Outcome.EXECUTE and tx.claim.lease.token == 2
        assert tx.claim.record.finished_at is not None  # the finished row, on every store
        raise RuntimeError("the handler failed")
    assert store.get(scope, "key-1") == before  # token, lock and all
    store.finish(holder, response(1))  # its token is current again
    assert store.claim(request(scope)).response == response(1)


@requires(Capability.TRANSACTIONS)
def test_f3_a_claim_given_its_response_burns_no_id_on_a_replay(store: Any, scope: str) -> None:
    # A replay or a mismatch writes nothing: on SQLite not even an AUTOINCREMENT id.
    first = store.claim(request(scope)).lease
    store.finish(first, response(1))
    for fingerprint in (FP, OTHER_FP, FP):
        with store.transaction(claim=request(scope, fingerprint=fingerprint), finished=response(2)):
            pass
    assert store.claim(request(scope, key="key-2")).lease.id == first.id + 1
