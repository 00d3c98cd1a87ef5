"""The key-status tests: ``store.key_status(scope, key)`` names a key's state on the
store's clock, with its times and its stored status code, and a finished key past its
retention is EXPIRED before it is deleted, and replays until it is (B3)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ...states import KeyState, KeyStatus, Outcome, StoredResponse
from ._support import EXPIRED, OTHER_FP, SHORT, Clock, request, response


def test_key_status_of_an_unknown_key_is_none(store: Any, scope: str) -> None:
    assert store.key_status(scope, "never-sent") is None


def test_key_status_names_each_state_with_its_times(store: Any, scope: str, clock: Clock) -> None:
    lease = store.claim(request(scope, retention=timedelta(hours=1))).lease
    running = store.key_status(scope, "key-1")
    assert isinstance(running, KeyStatus)
    assert (running.scope, running.key, running.state) == (scope, "key-1", KeyState.PROCESSING)
    assert running.response_status is None and running.finished_at is None
    assert running.expires_at is not None
    assert running.created_at <= running.now < running.expires_at
    store.finish(lease, response())
    done = store.key_status(scope, "key-1")
    assert (done.state, done.response_status) == (KeyState.COMPLETE, 201)
    assert done.finished_at is not None and done.created_at <= done.finished_at <= done.now
    assert done.expires_at - done.finished_at == timedelta(hours=1)
    # The status is a view of the key: it changes nothing a claim sees.
    assert store.claim(request(scope)).response == response()


def test_key_status_of_pending_failed_and_errored_keys(
    store: Any, scope: str, clock: Clock
) -> None:
    store.claim(request(scope, key="abandoned", lock_timeout=SHORT))
    clock.pass_lock(scope, "abandoned", EXPIRED)
    assert store.key_status(scope, "abandoned").state is KeyState.PENDING
    declined = store.claim(request(scope, key="declined")).lease
    store.finish(declined, StoredResponse.of(402, body="declined"))
    status = store.key_status(scope, "declined")
    assert (status.state, status.response_status) == (KeyState.FAILED, 402)
    unknown = store.claim(request(scope, key="unknown")).lease
    store.finish(unknown, StoredResponse.of(502, body="?"), error="timeout")
    status = store.key_status(scope, "unknown")
    assert (status.state, status.response_status) == (KeyState.ERRORED, 502)


def test_key_status_is_expired_once_the_retention_passed_before_deletion(
    store: Any, scope: str, clock: Clock
) -> None:
    lease = store.claim(request(scope, retention=clock.retention)).lease
    store.finish(lease, response())
    assert store.key_status(scope, "key-1").state is KeyState.COMPLETE
    clock.pass_retention(scope, "key-1")
    status = store.key_status(scope, "key-1")
    # A store whose records expire on their own (a Redis TTL) may have forgotten the
    # key already: then it holds nothing to report. One that keeps it until a reaper
    # deletes it reports it expired, on its own clock, with its stored status code.
    if status is not None:
        assert status.state is KeyState.EXPIRED
        assert status.expires_at <= status.now
        assert status.response_status == 201


def test_a_finished_key_past_its_retention_replays_until_it_is_deleted(
    store: Any, scope: str, clock: Clock
) -> None:
    # The decision (docs/design.md, B3): retention is the least a key is kept; past
    # it, until the key is deleted, a retry still gets the stored response, because
    # replaying never causes a second effect and running again would. Once deleted,
    # the key is forgotten and a request with it is a new request.
    stored = StoredResponse.of(201, {"content-type": "application/json"}, b'{"id": "ch_1"}')
    lease = store.claim(request(scope, retention=clock.retention)).lease
    store.finish(lease, stored)
    clock.pass_retention(scope, "key-1")
    expired = store.key_status(scope, "key-1")
    claim = store.claim(request(scope))
    if expired is None:
        assert claim.outcome is Outcome.EXECUTE  # forgotten: a new request
        return
    assert claim.outcome is Outcome.REPLAY and claim.response == stored
    # Another request with the key is still refused: the key is known until deleted.
    assert store.claim(request(scope, fingerprint=OTHER_FP)).outcome is Outcome.MISMATCH
    # A replay renews nothing: the key stays expired, for the reaper.
    assert store.key_status(scope, "key-1").state is KeyState.EXPIRED
