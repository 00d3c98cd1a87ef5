"""F5: the operator's listing, counts and eviction; the SQL state agrees with
states.key_state for keys in every state."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from idempotence import KeyNotFound, KeyState, LockLost, StoredResponse, key_state
from idempotence.maintenance import KeyIsLocked, evict_key, list_keys, show_key, stats
from tests.maintenance.support import (
    EXPIRED,
    Backend,
    claim,
    finished,
    new_scope,
    pending,
)

AGES = ("created_at", "last_run_at", "finished_at", "expires_at", "locked_at")


def populate(db: Backend, scope: str) -> dict[str, KeyState]:
    """Keys in every state (two ways to be expired), with the state each must show."""
    store = db.store
    claim(store, scope, "processing")
    pending(store, scope, "pending")
    claim(store, scope, "lock-expired", lock_timeout=EXPIRED)  # pending again
    finished(store, scope, "complete", status=201)
    finished(store, scope, "redirect", status=303)
    finished(store, scope, "failed", status=402)
    finished(store, scope, "errored", error="timeout talking to the bank")
    finished(store, scope, "expired-finished")
    pending(store, scope, "expired-pending")
    finished(store, scope, "errored-and-old", error="reset")
    finished(store, scope, "kept-forever", retention=None)
    for key in ("expired-finished", "expired-pending", "errored-and-old", "kept-forever"):
        db.backdate(scope, key, timedelta(days=2), *AGES)
    time.sleep(0.02)
    return {
        "processing": KeyState.PROCESSING,
        "pending": KeyState.PENDING,
        "lock-expired": KeyState.PENDING,
        "complete": KeyState.COMPLETE,
        "redirect": KeyState.COMPLETE,
        "failed": KeyState.FAILED,
        "errored": KeyState.ERRORED,
        "expired-finished": KeyState.EXPIRED,
        "expired-pending": KeyState.EXPIRED,
        "errored-and-old": KeyState.ERRORED,
        "kept-forever": KeyState.COMPLETE,
    }


def test_f5_sql_state_agrees_with_key_state(db: Backend) -> None:
    scope = new_scope()
    expected = populate(db, scope)

    rows = list_keys(db.store, scope=scope, limit=100)

    assert {row.record.key: row.state for row in rows} == expected
    for row in rows:
        assert row.state is key_state(row.record, row.now), row.record.key


@pytest.mark.parametrize("state", list(KeyState))
def test_f5_filtering_by_state_agrees_with_key_state(db: Backend, state: KeyState) -> None:
    scope = new_scope()
    expected = populate(db, scope)

    rows = list_keys(db.store, state=state, scope=scope, limit=100)

    assert sorted(row.record.key for row in rows) == sorted(
        key for key, s in expected.items() if s is state
    )
    # The filter is applied before the limit.
    if rows:
        assert len(list_keys(db.store, state=state, scope=scope, limit=1)) == 1


def test_f5_listing_is_newest_first_and_crosses_scopes(db: Backend) -> None:
    first, second = new_scope(), new_scope()
    finished(db.store, first, "a")
    finished(db.store, second, "b")
    rows = list_keys(db.store, limit=10)
    assert [(r.record.scope, r.record.key) for r in rows] == [(second, "b"), (first, "a")]
    assert [r.record.key for r in list_keys(db.store, scope=first)] == ["a"]


def test_f5_show_key(db: Backend) -> None:
    scope = new_scope()
    finished(db.store, scope, "k", status=402)
    row = show_key(db.store, scope, "k")
    assert row.state is KeyState.FAILED
    assert row.record.response == StoredResponse.of(402, body="{}")
    with pytest.raises(KeyNotFound, match="'nope'"):
        show_key(db.store, scope, "nope")


def test_f5_evict_refuses_a_live_lock_unless_forced(db: Backend) -> None:
    scope = new_scope()
    holder = claim(db.store, scope, "busy").lease
    assert holder is not None
    with pytest.raises(KeyIsLocked, match="--force"):
        evict_key(db.store, scope, "busy")
    assert db.store.get(scope, "busy") is not None

    evicted = evict_key(db.store, scope, "busy", force=True)

    assert evicted.state is KeyState.PROCESSING
    assert db.store.get(scope, "busy") is None
    # The holder finds its key gone: its writes are refused (F1).
    with pytest.raises(LockLost), db.store.transaction() as tx:
        db.store.checkpoint(tx, holder, "next")


def test_f5_evict_an_unlocked_key_and_a_missing_one(db: Backend) -> None:
    scope = new_scope()
    finished(db.store, scope, "done")
    assert evict_key(db.store, scope, "done").state is KeyState.COMPLETE
    with pytest.raises(KeyNotFound):
        evict_key(db.store, scope, "done")


def test_f5_stats(db: Backend) -> None:
    scope = new_scope()
    expected = populate(db, scope)
    lease = claim(db.store, scope, "taken-over", lock_timeout=EXPIRED).lease
    assert lease is not None
    time.sleep(0.02)
    claim(db.store, scope, "taken-over")  # token 2: one takeover

    result = stats(db.store)

    counts = {state: 0 for state in KeyState}
    for state in [*expected.values(), KeyState.PROCESSING]:
        counts[state] += 1
    assert result.states == counts
    assert result.total == len(expected) + 1
    assert result.takeovers == 1
    age = result.oldest_pending_age
    assert age is not None and timedelta(0) <= age < timedelta(minutes=5)
    assert result.jobs == {"staged": 0, "ready": 0, "done": 0, "dead": 0}


def test_f5_stats_of_an_empty_store(db: Backend) -> None:
    result = stats(db.store)
    assert result.total == 0
    assert result.oldest_pending_age is None
    assert result.takeovers == 0
