"""F8 at the store: a request-as-transaction claim (``transaction(claim=...)``) on a key
whose row another open transaction holds does not wait for that transaction (which
runs as long as its handler). It gives its connection back at once, answered from the
key's last committed version: IN_PROGRESS (``held``), or still P2/P3 when that
version decides."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from idempotence import ClaimRequest, Outcome, StoredResponse, TransactionEnded
from idempotence.stores.postgres import PostgresStore

#: The slow tier: each test waits out a bounded lock wait (F8, seconds).
pytestmark = pytest.mark.slow

HOLD = 3.0  # how long the holder's transaction stays open
PROMPT = 1.0  # a held claim answers well before the holder ends
FP, OTHER_FP = "a" * 64, "b" * 64
RESPONSE = StoredResponse(status=201, headers=(), body=b"first")


def req(scope: str, fingerprint: str = FP) -> ClaimRequest:
    return ClaimRequest(
        scope=scope, key="k", fingerprint=fingerprint, lock_timeout=timedelta(seconds=60)
    )


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    with PostgresStore(pg_url, max_size=4) as opened:
        yield opened


@contextmanager
def holding(
    store: PostgresStore, request: ClaimRequest, *, finish: bool, fixed: bool = False
) -> Iterator[Any]:
    """A thread that claims ``request`` in a transaction and keeps it open HOLD
    seconds (finishing the key at the commit when ``finish``; with ``fixed``, the claim
    writes it finished itself: claim_finished)."""
    claimed = threading.Event()
    seen: dict[str, Any] = {}

    def hold() -> None:
        with store.transaction(claim=request, finished=RESPONSE if fixed else None) as tx:
            seen["claim"] = tx.claim
            assert tx.claim is not None and tx.claim.lease is not None
            claimed.set()
            time.sleep(HOLD)
            if finish:
                store.finish(tx.claim.lease, RESPONSE, tx=tx, at_commit=True)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert claimed.wait(10)
        assert seen["claim"].outcome is Outcome.EXECUTE
        yield seen
    finally:
        thread.join()


def claim_in_transaction(store: PostgresStore, request: ClaimRequest) -> tuple[Any, float]:
    started = time.monotonic()
    with store.transaction(claim=request) as tx:
        claim = tx.claim
    return claim, time.monotonic() - started


def test_f8_a_claim_on_a_key_an_open_transaction_inserted_is_held_not_blocked(
    store: PostgresStore, scope: str
) -> None:
    with holding(store, req(scope), finish=True):
        claim, seconds = claim_in_transaction(store, req(scope))
        assert seconds < PROMPT
        assert claim.outcome is Outcome.IN_PROGRESS
        assert claim.held and claim.retry_after == 1.0
        assert claim.lease is None
    # The holder committed: the next claim replays its response (P3).
    claim, _ = claim_in_transaction(store, req(scope))
    assert claim.outcome is Outcome.REPLAY and claim.response == RESPONSE


def test_r2_a_held_claims_transaction_kept_past_its_block_refuses_every_use(
    store: PostgresStore, scope: str
) -> None:
    # A held claim is answered from a read on the connection after its claim rolled
    # back: that transaction object ends with its block like any other.
    with holding(store, req(scope), finish=True):
        with store.transaction(claim=req(scope)) as kept:
            assert kept.claim is not None and kept.claim.held
        for use in (lambda: kept.execute("SELECT 1"), lambda: kept.connection):
            with pytest.raises(TransactionEnded, match="block has ended"):
                use()
        assert kept.claim.outcome is Outcome.IN_PROGRESS  # what it answered stays


@pytest.mark.parametrize("taken_over", [False, True], ids=["new key", "takeover"])
def test_f8_a_claim_racing_a_claim_that_wrote_its_key_finished_is_held_then_replays(
    store: PostgresStore, scope: str, taken_over: bool
) -> None:
    # claim_finished holds the row it inserted, or took over, until its COMMIT: a twin
    # neither waits for it nor sees the uncommitted finished row.
    if taken_over:
        first = store.claim(req(scope))
        assert first.lease is not None
        store.release(first.lease)
    with holding(store, req(scope), finish=False, fixed=True):
        claim, seconds = claim_in_transaction(store, req(scope))
        assert seconds < PROMPT
        assert claim.outcome is Outcome.IN_PROGRESS and claim.held
        mismatch, _ = claim_in_transaction(store, req(scope, OTHER_FP))
        expected = Outcome.MISMATCH if taken_over else Outcome.IN_PROGRESS
        assert mismatch.outcome is expected  # P2 from a committed version, if any
    claim, _ = claim_in_transaction(store, req(scope))
    assert claim.outcome is Outcome.REPLAY and claim.response == RESPONSE


def test_f8_a_held_key_taken_over_in_a_transaction_still_answers_p2_first(
    store: PostgresStore, scope: str
) -> None:
    first = store.claim(req(scope))
    assert first.lease is not None
    store.release(first.lease)  # committed, unlocked: the next claim takes it over
    with holding(store, req(scope), finish=False):
        mismatch, seconds = claim_in_transaction(store, req(scope, OTHER_FP))
        assert seconds < PROMPT
        assert mismatch.outcome is Outcome.MISMATCH  # P2, from the committed version
        duplicate, seconds = claim_in_transaction(store, req(scope))
        assert seconds < PROMPT
        assert duplicate.outcome is Outcome.IN_PROGRESS and duplicate.held


def test_f8_a_finished_key_whose_row_is_locked_still_replays(
    store: PostgresStore, scope: str
) -> None:
    first = store.claim(req(scope))
    assert first.lease is not None
    store.finish(first.lease, RESPONSE)
    locked = threading.Event()

    def lock_row() -> None:
        with store.transaction() as tx:
            tx.execute(
                "SELECT id FROM idempotency_keys WHERE scope = %(s)s FOR UPDATE", {"s": scope}
            )
            locked.set()
            time.sleep(HOLD)

    thread = threading.Thread(target=lock_row)
    thread.start()
    try:
        assert locked.wait(10)
        claim, seconds = claim_in_transaction(store, req(scope))
        assert seconds < PROMPT
        assert claim.outcome is Outcome.REPLAY and claim.response == RESPONSE  # P3
    finally:
        thread.join()


def test_f8_the_application_statements_after_the_claim_keep_their_lock_timeout(
    store: PostgresStore, scope: str
) -> None:
    with store.transaction(claim=req(scope)) as tx:
        assert tx.claim is not None and tx.claim.outcome is Outcome.EXECUTE
        assert tx.execute("SHOW lock_timeout")[0]["lock_timeout"] == "0"
        tx.execute("SET LOCAL lock_timeout = '7s'")  # the application's own setting
    with store.transaction() as tx:
        assert tx.execute("SHOW lock_timeout")[0]["lock_timeout"] == "0"


def test_f8_the_claim_restores_the_lock_timeout_whatever_its_outcome(
    pg_url: str, scope: str
) -> None:
    """The claim bounds its own lock wait and restores the setting in the same statement:
    on every branch (claimed, replayed: its INSERT skipped, mismatched), and on a
    session that has the bound's saved setting from an earlier transaction."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn, PostgresStore(conn) as store:
        with store.transaction(claim=req(scope)) as tx:
            assert tx.claim is not None and tx.claim.lease is not None
            assert tx.execute("SHOW lock_timeout")[0]["lock_timeout"] == "0"
            store.finish(tx.claim.lease, RESPONSE, tx=tx, at_commit=True)
        for fingerprint, outcome in ((FP, Outcome.REPLAY), (OTHER_FP, Outcome.MISMATCH)):
            with store.transaction(claim=req(scope, fingerprint)) as tx:
                assert tx.claim is not None and tx.claim.outcome is outcome
                assert tx.execute("SHOW lock_timeout")[0]["lock_timeout"] == "0"
        conn.execute("SET lock_timeout = '9s'")  # the session's own setting
        with store.transaction(claim=req(f"{scope}-2")) as tx:
            assert tx.claim is not None and tx.claim.outcome is Outcome.EXECUTE
            assert tx.execute("SHOW lock_timeout")[0]["lock_timeout"] == "9s"


class _Rollback(Exception):
    pass


def test_f8_a_transaction_block_entered_again_is_a_transaction_of_its_own(
    store: PostgresStore,
) -> None:
    """The same ``store.transaction(...)`` object entered a second time opens a
    transaction of its own: when that one's claim finds the key held (F8), the block
    ends cleanly, and nothing of the first entry's (its connection's atomic block) is
    exited again."""
    request = req("again")
    block = store.transaction(claim=request)
    with pytest.raises(_Rollback), block as tx:
        assert tx.claim is not None and tx.claim.outcome is Outcome.EXECUTE
        raise _Rollback  # rolled back: the key is free again
    with holding(store, request, finish=False), block as tx:
        assert tx.claim is not None and tx.claim.outcome is Outcome.IN_PROGRESS
        assert tx.claim.held
