"""The key-store tests: P1-P5, F1 and F2 through the operations every store has
(claim, finish, release, heartbeat, forget, get)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from ...errors import LockLost
from ...states import STARTED, KeyState, Outcome, StoredResponse, key_state
from ...stores.capabilities import Capability
from .._blocking import Blocking
from ._support import EXPIRED, OTHER_FP, SHORT, Clock, request, response

# -- P1 ----------------------------------------------------------------------------------


def test_p1_a_new_key_executes_from_started_with_token_1(store: Any, scope: str) -> None:
    claim = store.claim(request(scope, params={"amount": 2000}, path="/v1/rides", flow="rides"))
    assert claim.outcome is Outcome.EXECUTE
    assert claim.lease is not None
    assert (claim.lease.token, claim.lease.recovery_point) == (1, STARTED)
    record = claim.record
    assert (record.scope, record.key, record.path, record.flow) == (
        scope,
        "key-1",
        "/v1/rides",
        "rides",
    )
    assert record.params == {"amount": 2000}
    assert record.locked_at is not None and record.finished_at is None


# -- P2 ----------------------------------------------------------------------------------


def test_p2_mismatch_on_a_live_key(store: Any, scope: str) -> None:
    store.claim(request(scope))
    assert store.claim(request(scope, fingerprint=OTHER_FP)).outcome is Outcome.MISMATCH


def test_p2_mismatch_beats_replay_on_a_finished_key(store: Any, scope: str) -> None:
    lease = store.claim(request(scope)).lease
    store.finish(lease, response())
    claim = store.claim(request(scope, fingerprint=OTHER_FP))
    assert claim.outcome is Outcome.MISMATCH
    assert claim.lease is None


def test_p2_mismatch_never_takes_over_an_abandoned_key(store: Any, scope: str) -> None:
    lease = store.claim(request(scope)).lease
    store.release(lease)
    assert store.claim(request(scope, fingerprint=OTHER_FP)).outcome is Outcome.MISMATCH
    # ... and the rightful retry still resumes it.
    assert store.claim(request(scope)).outcome is Outcome.EXECUTE


# -- P3 ----------------------------------------------------------------------------------


def test_p3_a_finished_key_replays_the_stored_response_verbatim(store: Any, scope: str) -> None:
    lease = store.claim(request(scope)).lease
    stored = StoredResponse(
        status=402,
        headers=(("content-type", "application/json"), ("x-request-id", "r1"), ("x-dup", "a")),
        body=bytes(range(256)),  # every byte value survives
    )
    store.finish(lease, stored)
    for _ in range(3):
        claim = store.claim(request(scope))
        assert claim.outcome is Outcome.REPLAY
        assert claim.response == stored
        assert claim.lease is None


def test_p3_a_replay_of_a_key_finished_while_locked_by_a_zombie(store: Any, scope: str) -> None:
    # A finished key replays whatever its lock fields say: finish unlocks.
    lease = store.claim(request(scope)).lease
    store.finish(lease, response())
    assert store.get(scope, "key-1").locked_at is None
    assert store.claim(request(scope)).outcome is Outcome.REPLAY


# -- P4 ----------------------------------------------------------------------------------


def test_p4_a_live_lock_answers_in_progress_with_retry_after(
    store: Any, scope: str, clock: Clock
) -> None:
    store.claim(request(scope, lock_timeout=timedelta(seconds=30)))
    # Not at once: a store that counted the lock in the wrong unit (a thousandth of
    # it, 30 ms) would take the key over by then.
    clock.pass_lock(scope, "key-1", timedelta(milliseconds=200))
    claim = store.claim(request(scope))
    assert claim.outcome is Outcome.IN_PROGRESS
    assert claim.lease is None
    assert claim.retry_after is not None and 25 < claim.retry_after <= 30
    assert claim.record.lock_token == 1  # an in-progress answer changes nothing


# -- P5 ----------------------------------------------------------------------------------


def test_p5_an_expired_lock_is_taken_over(store: Any, scope: str, clock: Clock) -> None:
    first = store.claim(request(scope, lock_timeout=SHORT)).lease
    assert store.claim(request(scope)).outcome is Outcome.IN_PROGRESS
    clock.pass_lock(scope, "key-1", EXPIRED)
    claim = store.claim(request(scope))
    assert claim.outcome is Outcome.EXECUTE
    assert claim.lease.token == first.token + 1


# -- scoping, times, records -------------------------------------------------------------


def test_the_same_key_in_two_scopes_is_two_keys(store: Any, scope: str) -> None:
    other = scope + "-other"
    a = store.claim(request(scope, params={"who": "a"}))
    b = store.claim(request(other, fingerprint=OTHER_FP, params={"who": "b"}))
    assert (a.outcome, b.outcome) == (Outcome.EXECUTE, Outcome.EXECUTE)
    store.finish(a.lease, response(1))
    assert store.claim(request(scope)).response == response(1)
    assert store.claim(request(other, fingerprint=OTHER_FP)).outcome is Outcome.IN_PROGRESS
    assert store.get(other, "key-1").params == {"who": "b"}


def test_get_returns_none_for_an_unknown_key(store: Any, scope: str) -> None:
    assert store.get(scope, "nope") is None


def test_retention_none_keeps_a_key_forever(store: Any, scope: str) -> None:
    lease = store.claim(request(scope, retention=None)).lease
    store.finish(lease, response())
    assert store.get(scope, "key-1").expires_at is None


def test_finish_restarts_the_retention_window(store: Any, scope: str) -> None:
    lease = store.claim(request(scope, retention=timedelta(hours=1))).lease
    time.sleep(0.05)
    store.finish(lease, response())
    record = store.get(scope, "key-1")
    assert record.expires_at - record.finished_at == timedelta(hours=1)
    assert record.finished_at > record.created_at


def test_errored_keys_are_terminal_and_flagged(store: Any, scope: str) -> None:
    lease = store.claim(request(scope)).lease
    store.finish(lease, StoredResponse.of(502, body="upstream unknown"), error="timeout")
    record = store.get(scope, "key-1")
    assert record.error == "timeout"
    assert store.claim(request(scope)).outcome is Outcome.REPLAY
    assert key_state(record, record.finished_at) is KeyState.ERRORED


# -- F1 fencing ------------------------------------------------------------------------


def test_f1_a_finished_key_refuses_every_fenced_write(store: Any, scope: str) -> None:
    lease = store.claim(request(scope)).lease
    store.finish(lease, response(1))
    # The lease still names the key's id and token: only "finished" refuses them.
    writes: list[Callable[[], Any]] = [
        lambda: store.finish(lease, response(2)),
        lambda: store.heartbeat(lease),
        lambda: store.release(lease),
        lambda: store.forget(lease),
    ]
    for write in writes:
        with pytest.raises(LockLost):
            write()
    assert store.claim(request(scope)).response == response(1)


def test_lock_lost_says_what_happened(store: Any, scope: str, clock: Clock) -> None:
    lease = store.claim(request(scope, lock_timeout=SHORT)).lease
    clock.pass_lock(scope, "key-1", EXPIRED)
    store.claim(request(scope))
    with pytest.raises(LockLost) as caught:
        store.release(lease)
    assert "key-1" in str(caught.value) and "roll back" in str(caught.value)
    # What was lost, for the log and the caller: set on the error by the store.
    lost = caught.value
    assert (getattr(lost, "scope", None), getattr(lost, "token", None)) == (scope, 1)


# -- F2 heartbeats ---------------------------------------------------------------------


def test_f2_a_heartbeat_keeps_the_lock(store: Any, scope: str, clock: Clock) -> None:
    lease = store.claim(request(scope, lock_timeout=timedelta(milliseconds=600))).lease
    for _ in range(3):
        clock.pass_lock(scope, "key-1", timedelta(milliseconds=350))
        store.heartbeat(lease)
    # 1.05 s after the claim, well past the timeout, the lock still holds.
    assert store.claim(request(scope)).outcome is Outcome.IN_PROGRESS
    clock.pass_lock(scope, "key-1", timedelta(milliseconds=700))
    assert store.claim(request(scope)).outcome is Outcome.EXECUTE


# -- phases share the application's transaction (R2) -----------------------------------


def test_a_second_key_with_unicode_and_quotes(store: Any, scope: str) -> None:
    key = "\"quoted\" 'single' \\ %s %(x)s :x ?"
    claim = store.claim(request(scope, key=key, params={"note": "café ☕"}))
    assert claim.outcome is Outcome.EXECUTE
    assert store.get(scope, key).params == {"note": "café ☕"}


def test_keys_are_unique_per_scope_even_in_many_claims(store: Any, scope: str) -> None:
    keys = [uuid.uuid4().hex for _ in range(50)]
    leases = [store.claim(request(scope, key=k)).lease for k in keys]
    assert len({lease.id for lease in leases}) == 50
    assert all(store.claim(request(scope, key=k)).outcome is Outcome.IN_PROGRESS for k in keys)


# -- capabilities ------------------------------------------------------------------------


def test_the_store_has_the_operations_of_what_it_declares(
    store: Any, declared: frozenset[Capability]
) -> None:
    own = store.store if isinstance(store, Blocking) else store
    shares = [callable(getattr(own, name, None)) for name in ("transaction", "checkpoint")]
    assert all(shares) is (Capability.TRANSACTIONS in declared), (
        "the store's capabilities say what it can do: declare Capability.TRANSACTIONS "
        "exactly when it has transaction() and checkpoint()"
    )
    waits = callable(getattr(own, "wait_for_settle", None))
    assert waits is (Capability.WAITING in declared), (
        "declare Capability.WAITING exactly when the store has wait_for_settle()"
    )
    if Capability.LISTENING in declared:
        assert Capability.WAITING in declared, (
            "Capability.LISTENING is a way of waiting: declare Capability.WAITING too"
        )
