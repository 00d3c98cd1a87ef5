"""The key state machine: claim arbitration (DESIGN 4, P1-P5) and key states (F5)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idempotence.states import (
    DEFAULT_LOCK_TIMEOUT,
    FINISHED,
    STARTED,
    Claim,
    KeyRecord,
    KeyState,
    KeyStatus,
    Lease,
    Outcome,
    StoredResponse,
    arbitrate,
    claim_from,
    key_state,
)

NOW = datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)
FP = "a" * 64
OTHER_FP = "b" * 64
TIMEOUT = DEFAULT_LOCK_TIMEOUT
TICK = timedelta(microseconds=1)
CREATED = StoredResponse.of(201, {"content-type": "application/json"}, b'{"id": "ch_1"}')


def record(**changes: Any) -> KeyRecord:
    """An unlocked, unfinished key claimed once and then abandoned (a crashed run)."""
    fields: dict[str, Any] = {
        "id": 7,
        "scope": "acct_1",
        "key": "key-1",
        "method": "POST",
        "path": "/charges",
        "fingerprint": FP,
        "params": {"amount": 100},
        "flow": "default",
        "recovery_point": STARTED,
        "lock_token": 1,
        "locked_at": None,
        "lock_timeout": TIMEOUT,
        "response": None,
        "error": None,
        "created_at": NOW - timedelta(minutes=5),
        "last_run_at": NOW - timedelta(minutes=5),
        "finished_at": None,
        "expires_at": NOW + timedelta(hours=24),
    }
    fields.update(changes)
    return KeyRecord(**fields)


def finished(**changes: Any) -> KeyRecord:
    """A key whose flow finished and whose response is stored."""
    fields: dict[str, Any] = {
        "recovery_point": FINISHED,
        "finished_at": NOW - timedelta(minutes=1),
        "response": CREATED,
    }
    fields.update(changes)
    return record(**fields)


def locked(age: timedelta, **changes: Any) -> KeyRecord:
    """An unfinished key whose lock was taken ``age`` ago."""
    return record(locked_at=NOW - age, **changes)


# -- P1: a new key ------------------------------------------------------------------------


@pytest.mark.parametrize("fingerprint", [FP, OTHER_FP, ""])
def test_p1_no_existing_row_executes(fingerprint: str) -> None:
    assert arbitrate(None, fingerprint, NOW) is Outcome.EXECUTE


def test_p1_a_fresh_claim_executes_from_started_with_token_1() -> None:
    fresh = record(locked_at=NOW, lock_token=1, last_run_at=NOW, created_at=NOW)
    claim = claim_from(fresh, FP, NOW, claimed=True)
    assert claim == Claim(
        Outcome.EXECUTE,
        fresh,
        lease=Lease(id=7, scope="acct_1", key="key-1", token=1, recovery_point=STARTED),
    )
    assert claim.retry_after is None


# -- P2: a different request under the same key -------------------------------------------


@pytest.mark.parametrize(
    "existing",
    [
        record(),
        locked(TICK),
        locked(TIMEOUT - TICK),
        locked(TIMEOUT),
        locked(timedelta(days=3)),
        finished(),
        finished(response=StoredResponse.of(402, body=b"declined")),
        finished(locked_at=NOW),
        finished(error="indeterminate charge", response=None),
        record(recovery_point="charge_created"),
        finished(expires_at=NOW - timedelta(hours=1)),
    ],
    ids=[
        "pending",
        "locked-just-now",
        "locked-nearly-expired",
        "lock-expired-exactly",
        "lock-long-expired",
        "finished",
        "finished-402",
        "finished-with-live-lock",
        "errored",
        "mid-flow",
        "expired",
    ],
)
def test_p2_fingerprint_mismatch_is_mismatch_whatever_the_row_state(existing: KeyRecord) -> None:
    assert arbitrate(existing, OTHER_FP, NOW) is Outcome.MISMATCH


def test_p2_fingerprints_compare_exactly() -> None:
    assert arbitrate(record(), FP.upper(), NOW) is Outcome.MISMATCH
    assert arbitrate(record(), FP + " ", NOW) is Outcome.MISMATCH
    assert arbitrate(record(), "", NOW) is Outcome.MISMATCH


def test_p2_mismatch_beats_finished() -> None:
    """Replaying another request's stored response would be a lie (P2 before P3)."""
    assert arbitrate(finished(), FP, NOW) is Outcome.REPLAY
    assert arbitrate(finished(), OTHER_FP, NOW) is Outcome.MISMATCH


def test_p2_mismatch_beats_locked() -> None:
    assert arbitrate(locked(TICK), FP, NOW) is Outcome.IN_PROGRESS
    assert arbitrate(locked(TICK), OTHER_FP, NOW) is Outcome.MISMATCH


def test_p2_claim_from_a_mismatched_row_has_no_lease_and_no_retry_after() -> None:
    for existing in (record(), locked(TICK), finished()):
        claim = claim_from(existing, OTHER_FP, NOW, claimed=False)
        assert claim.outcome is Outcome.MISMATCH
        assert claim.lease is None
        assert claim.retry_after is None
        assert claim.record is existing


# -- P3: a finished key replays -------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 201, 204, 302, 400, 402, 409, 422, 500, 503])
def test_p3_finished_key_replays_whatever_status_was_stored(status: int) -> None:
    existing = finished(response=StoredResponse.of(status, body=b"stored"))
    assert arbitrate(existing, FP, NOW) is Outcome.REPLAY


def test_p3_finished_beats_locked_a_finished_key_with_a_live_lock_still_replays() -> None:
    assert arbitrate(finished(locked_at=NOW), FP, NOW) is Outcome.REPLAY
    assert arbitrate(finished(locked_at=NOW - TICK), FP, NOW) is Outcome.REPLAY


def test_p3_finished_key_with_an_expired_lock_replays() -> None:
    assert arbitrate(finished(locked_at=NOW - TIMEOUT * 2), FP, NOW) is Outcome.REPLAY


def test_p3_finished_key_past_expires_at_replays_until_the_reaper_deletes_it() -> None:
    """arbitrate ignores expires_at: the row still holds the key, so the stored answer
    is the only truthful one (B3 removes it; only then is the key new again)."""
    assert arbitrate(finished(expires_at=NOW - TICK), FP, NOW) is Outcome.REPLAY


def test_p3_claim_from_a_finished_row_carries_the_stored_response() -> None:
    existing = finished(locked_at=NOW)
    claim = claim_from(existing, FP, NOW, claimed=False)
    assert claim.outcome is Outcome.REPLAY
    assert claim.response is CREATED
    assert claim.lease is None
    assert claim.retry_after is None


# -- P4: a live lock means in progress ---------------------------------------------------


@pytest.mark.parametrize(
    "age",
    [timedelta(0), TICK, timedelta(seconds=1), timedelta(seconds=30), TIMEOUT - TICK],
    ids=str,
)
def test_p4_lock_younger_than_the_timeout_is_in_progress(age: timedelta) -> None:
    assert arbitrate(locked(age), FP, NOW) is Outcome.IN_PROGRESS


def test_p4_lock_taken_after_now_by_a_skewed_clock_is_still_live() -> None:
    assert arbitrate(record(locked_at=NOW + timedelta(seconds=5)), FP, NOW) is (Outcome.IN_PROGRESS)


def test_p4_each_record_uses_its_own_flow_lock_timeout() -> None:
    short = timedelta(seconds=5)
    assert arbitrate(locked(timedelta(seconds=4), lock_timeout=short), FP, NOW) is (
        Outcome.IN_PROGRESS
    )
    assert arbitrate(locked(timedelta(seconds=5), lock_timeout=short), FP, NOW) is (Outcome.EXECUTE)
    long = timedelta(hours=1)
    assert arbitrate(locked(timedelta(minutes=59), lock_timeout=long), FP, NOW) is (
        Outcome.IN_PROGRESS
    )


def test_p4_lock_expiry_boundary_expires_equal_to_now_counts_as_expired() -> None:
    at_boundary = locked(TIMEOUT)
    assert at_boundary.lock_expires_at() == NOW
    assert not at_boundary.lock_is_live(NOW)
    assert arbitrate(at_boundary, FP, NOW) is Outcome.EXECUTE
    just_before = locked(TIMEOUT - TICK)
    assert just_before.lock_expires_at() == NOW + TICK
    assert just_before.lock_is_live(NOW)
    assert arbitrate(just_before, FP, NOW) is Outcome.IN_PROGRESS


def test_p4_zero_lock_timeout_never_protects_a_lock() -> None:
    assert arbitrate(locked(timedelta(0), lock_timeout=timedelta(0)), FP, NOW) is Outcome.EXECUTE


def test_p4_unlocked_record_has_no_lock_expiry() -> None:
    assert record().lock_expires_at() is None
    assert not record().lock_is_live(NOW)


@pytest.mark.parametrize(
    ("age", "timeout", "retry_after"),
    [
        (timedelta(0), TIMEOUT, 60.0),
        (timedelta(seconds=10), TIMEOUT, 50.0),
        (timedelta(seconds=59.5), TIMEOUT, 0.5),
        (TIMEOUT - TICK, TIMEOUT, 1e-6),
        (timedelta(seconds=1), timedelta(seconds=5), 4.0),
        (timedelta(minutes=30), timedelta(hours=1), 1800.0),
        (timedelta(seconds=-5), TIMEOUT, 65.0),  # a lock stamped after now
    ],
)
def test_p4_retry_after_is_the_seconds_until_the_holders_lock_expires(
    age: timedelta, timeout: timedelta, retry_after: float
) -> None:
    claim = claim_from(locked(age, lock_timeout=timeout), FP, NOW, claimed=False)
    assert claim.outcome is Outcome.IN_PROGRESS
    assert claim.retry_after == pytest.approx(retry_after)
    assert claim.retry_after is not None
    assert claim.retry_after > 0
    assert claim.lease is None


# -- P5: takeover ---------------------------------------------------------------------------


def test_p5_unlocked_unfinished_key_executes() -> None:
    assert arbitrate(record(), FP, NOW) is Outcome.EXECUTE


@pytest.mark.parametrize("age", [TIMEOUT, TIMEOUT + TICK, TIMEOUT * 2, timedelta(days=30)], ids=str)
def test_p5_lock_at_or_past_the_timeout_is_taken_over(age: timedelta) -> None:
    assert arbitrate(locked(age), FP, NOW) is Outcome.EXECUTE


def test_p5_takeover_resumes_from_the_recovery_point_with_the_stores_new_token() -> None:
    taken = locked(timedelta(0), recovery_point="charge_created", lock_token=4)
    claim = claim_from(taken, FP, NOW, claimed=True)
    assert claim.outcome is Outcome.EXECUTE
    assert claim.lease == Lease(
        id=7, scope="acct_1", key="key-1", token=4, recovery_point="charge_created"
    )
    assert claim.retry_after is None


def test_lease_advanced_changes_only_the_recovery_point() -> None:
    lease = Lease(id=1, scope="s", key="k", token=3, recovery_point=STARTED)
    assert lease.advanced("charged") == Lease(
        id=1, scope="s", key="k", token=3, recovery_point="charged"
    )
    assert lease.recovery_point == STARTED


# -- claim_from: the store and the state machine must agree ------------------------------


@pytest.mark.parametrize(
    "existing",
    [record(), locked(TIMEOUT), locked(TIMEOUT * 5), record(recovery_point="mid")],
    ids=["pending", "lock-expired-exactly", "lock-long-expired", "mid-flow"],
)
def test_p6_claim_from_asserts_when_the_store_did_not_take_a_key_it_should_have(
    existing: KeyRecord,
) -> None:
    """The store's takeover predicate and arbitrate() disagreeing is a bug, not a race."""
    with pytest.raises(AssertionError, match=r"store did not take key 'key-1'.*EXECUTE"):
        claim_from(existing, FP, NOW, claimed=False)


def test_claim_from_claimed_row_trusts_the_store() -> None:
    """A claimed row carries the lock the store just took; arbitrate() on it would say
    IN_PROGRESS, so claim_from does not consult it."""
    claimed_row = locked(timedelta(0), lock_token=2)
    assert arbitrate(claimed_row, FP, NOW) is Outcome.IN_PROGRESS
    assert claim_from(claimed_row, FP, NOW, claimed=True).outcome is Outcome.EXECUTE


@pytest.mark.parametrize(
    ("existing", "fingerprint", "outcome"),
    [
        (record(), OTHER_FP, Outcome.MISMATCH),
        (finished(), FP, Outcome.REPLAY),
        (finished(locked_at=NOW), FP, Outcome.REPLAY),
        (locked(TICK), FP, Outcome.IN_PROGRESS),
    ],
)
def test_claim_from_unclaimed_rows_follows_arbitrate(
    existing: KeyRecord, fingerprint: str, outcome: Outcome
) -> None:
    claim = claim_from(existing, fingerprint, NOW, claimed=False)
    assert claim.outcome is outcome is arbitrate(existing, fingerprint, NOW)
    assert claim.record is existing
    assert claim.lease is None


# -- key_state (F5) -------------------------------------------------------------------------


def test_f5_pending_is_unlocked_and_unfinished() -> None:
    assert key_state(record(), NOW) is KeyState.PENDING
    assert key_state(record(recovery_point="charge_created"), NOW) is KeyState.PENDING


def test_f5_an_expired_lock_on_an_unfinished_key_is_pending() -> None:
    assert key_state(locked(TIMEOUT), NOW) is KeyState.PENDING
    assert key_state(locked(TIMEOUT * 10), NOW) is KeyState.PENDING


@pytest.mark.parametrize("age", [timedelta(0), TICK, TIMEOUT - TICK], ids=str)
def test_f5_processing_is_a_live_lock(age: timedelta) -> None:
    assert key_state(locked(age), NOW) is KeyState.PROCESSING


def test_f5_a_live_lock_is_processing_even_past_expires_at() -> None:
    """The reaper must never delete a locked key (B3)."""
    assert key_state(locked(TICK, expires_at=NOW - TICK), NOW) is KeyState.PROCESSING


def test_f5_a_finished_key_with_a_live_lock_is_finished() -> None:
    """key_state agrees with arbitrate, which replays it (P3): finished is finished
    whatever the lock fields say (stores clear the lock when they finish anyway)."""
    assert key_state(finished(locked_at=NOW), NOW) is KeyState.COMPLETE


@pytest.mark.parametrize("status", [200, 201, 202, 204, 301, 302, 399])
def test_f5_complete_is_finished_below_400(status: int) -> None:
    existing = finished(response=StoredResponse.of(status))
    assert key_state(existing, NOW) is KeyState.COMPLETE


@pytest.mark.parametrize("status", [400, 402, 404, 408, 409, 422, 500, 502, 503])
def test_f5_failed_is_a_stored_error_response(status: int) -> None:
    existing = finished(response=StoredResponse.of(status))
    assert key_state(existing, NOW) is KeyState.FAILED


def test_f5_finished_key_with_a_stale_lock_is_complete() -> None:
    assert key_state(finished(locked_at=NOW - TIMEOUT), NOW) is KeyState.COMPLETE


@pytest.mark.parametrize("response", [None, StoredResponse.of(500), CREATED])
def test_r6_errored_is_finished_with_an_error(response: StoredResponse | None) -> None:
    existing = finished(error="charge timed out; provider has no idempotency", response=response)
    assert key_state(existing, NOW) is KeyState.ERRORED


@pytest.mark.parametrize(
    "existing",
    [record(), locked(TIMEOUT), finished(), finished(response=StoredResponse.of(402))],
    ids=["pending", "stale-lock", "complete", "failed"],
)
def test_f5_expired_at_and_after_expires_at(existing: KeyRecord) -> None:
    assert key_state(replace(existing, expires_at=NOW), NOW) is KeyState.EXPIRED
    assert key_state(replace(existing, expires_at=NOW - timedelta(days=1)), NOW) is (
        KeyState.EXPIRED
    )
    assert key_state(replace(existing, expires_at=NOW + TICK), NOW) is not KeyState.EXPIRED


def test_r6_errored_beats_expired() -> None:
    """An errored key waits for a human (R6), not for the reaper."""
    existing = finished(error="indeterminate", expires_at=NOW)
    assert key_state(existing, NOW) is KeyState.ERRORED


def test_f5_keys_kept_forever_never_expire() -> None:
    assert key_state(finished(expires_at=None), NOW + timedelta(days=3650)) is KeyState.COMPLETE
    assert key_state(record(expires_at=None), NOW + timedelta(days=3650)) is KeyState.PENDING


def test_f5_a_key_status_is_its_state_at_the_stores_now_and_never_its_body() -> None:
    done = finished(expires_at=NOW + timedelta(hours=1))
    status = KeyStatus.of(done, NOW)
    assert (status.scope, status.key, status.now) == (done.scope, done.key, NOW)
    assert (status.state, status.response_status) == (KeyState.COMPLETE, 201)
    assert (status.created_at, status.finished_at, status.expires_at) == (
        done.created_at,
        done.finished_at,
        done.expires_at,
    )
    assert not {"response", "body", "headers"} & set(KeyStatus.__slots__)
    # Past its expiry on the clock it is read with: expired, before any reaper.
    assert KeyStatus.of(done, NOW + timedelta(hours=1)).state is KeyState.EXPIRED
    assert KeyStatus.of(record(), NOW).response_status is None
    # An errored key reports its stored status code too.
    assert (
        KeyStatus.of(finished(error="x", response=StoredResponse.of(502)), NOW).response_status
        == 502
    )


def test_f5_every_key_state_is_reachable() -> None:
    examples = [
        record(),
        locked(TICK),
        finished(),
        finished(response=StoredResponse.of(402)),
        finished(error="x"),
        record(expires_at=NOW),
    ]
    assert {key_state(r, NOW) for r in examples} == set(KeyState)


def test_f5_state_names_are_the_observable_ones() -> None:
    assert {s.value for s in KeyState} == {
        "pending",
        "processing",
        "complete",
        "failed",
        "errored",
        "expired",
    }
    assert {o.value for o in Outcome} == {"execute", "mismatch", "replay", "in_progress"}


# -- the precedence table as a property -----------------------------------------------------

timeouts = st.sampled_from([timedelta(0), TICK, timedelta(seconds=1), TIMEOUT, timedelta(hours=1)])


@st.composite
def key_records(draw: st.DrawFn) -> tuple[KeyRecord, dict[str, Any]]:
    """A record plus the facts it was built from, so expectations need no KeyRecord logic."""
    timeout = draw(timeouts)
    lock = draw(st.sampled_from(["none", "recent", "old"]))
    if lock == "recent" and timeout == timedelta(0):
        lock = "old"  # no lock is young enough to be live under a zero timeout
    timeout_us = timeout // TICK
    if lock == "none":
        locked_at = None
    elif lock == "recent":
        locked_at = NOW - TICK * draw(st.integers(0, timeout_us - 1))
    else:
        locked_at = NOW - TICK * (timeout_us + draw(st.integers(0, 10**12)))
    is_finished = draw(st.booleans())
    status = draw(st.sampled_from([200, 201, 302, 400, 402, 409, 500]))
    error = draw(st.sampled_from([None, "indeterminate"])) if is_finished else None
    expires = draw(st.sampled_from(["never", "past", "now", "future"]))
    expires_at = {
        "never": None,
        "past": NOW - timedelta(hours=1),
        "now": NOW,
        "future": NOW + TICK,
    }[expires]
    same = draw(st.booleans())
    existing = record(
        fingerprint=FP if same else draw(st.sampled_from([OTHER_FP, "", FP.upper()])),
        lock_timeout=timeout,
        locked_at=locked_at,
        recovery_point=FINISHED if is_finished else draw(st.sampled_from([STARTED, "mid"])),
        finished_at=NOW - timedelta(seconds=1) if is_finished else None,
        response=StoredResponse.of(status) if is_finished else None,
        error=error,
        expires_at=expires_at,
        lock_token=draw(st.integers(1, 1000)),
    )
    facts = {
        "same": same,
        "finished": is_finished,
        "lock": lock,
        "status": status,
        "error": error,
        "expired": expires in ("past", "now"),
    }
    return existing, facts


def expected_outcome(facts: dict[str, Any]) -> Outcome:
    if not facts["same"]:
        return Outcome.MISMATCH  # P2
    if facts["finished"]:
        return Outcome.REPLAY  # P3
    if facts["lock"] == "recent":
        return Outcome.IN_PROGRESS  # P4
    return Outcome.EXECUTE  # P5


def expected_state(facts: dict[str, Any]) -> KeyState:
    if facts["finished"]:
        if facts["error"] is not None:
            return KeyState.ERRORED
        if facts["expired"]:
            return KeyState.EXPIRED
        return KeyState.COMPLETE if facts["status"] < 400 else KeyState.FAILED
    if facts["lock"] == "recent":
        return KeyState.PROCESSING
    if facts["expired"]:
        return KeyState.EXPIRED
    return KeyState.PENDING


@given(key_records())
def test_p1_p5_arbitrate_follows_the_precedence_table(
    case: tuple[KeyRecord, dict[str, Any]],
) -> None:
    existing, facts = case
    assert arbitrate(existing, FP, NOW) is expected_outcome(facts)


@given(key_records())
def test_p1_p5_claim_from_agrees_with_arbitrate_for_unclaimed_rows(
    case: tuple[KeyRecord, dict[str, Any]],
) -> None:
    existing, facts = case
    expected = expected_outcome(facts)
    if expected is Outcome.EXECUTE:
        with pytest.raises(AssertionError):
            claim_from(existing, FP, NOW, claimed=False)
        return
    claim = claim_from(existing, FP, NOW, claimed=False)
    assert claim.outcome is expected
    assert claim.lease is None
    if expected is Outcome.IN_PROGRESS:
        assert existing.locked_at is not None
        remaining = existing.locked_at + existing.lock_timeout - NOW
        assert claim.retry_after == remaining.total_seconds()
        assert 0 < claim.retry_after <= existing.lock_timeout.total_seconds()
    else:
        assert claim.retry_after is None


@given(key_records())
def test_p1_p5_a_claimed_row_always_executes_with_its_token(
    case: tuple[KeyRecord, dict[str, Any]],
) -> None:
    existing, facts = case
    if not facts["same"]:
        # A store that took a mismatched key is refused loudly (P2).
        with pytest.raises(AssertionError, match="mismatched"):
            claim_from(existing, FP, NOW, claimed=True)
        return
    claim = claim_from(existing, FP, NOW, claimed=True)
    assert claim.outcome is Outcome.EXECUTE
    assert claim.lease is not None
    assert claim.lease.token == existing.lock_token
    assert claim.lease.recovery_point == existing.recovery_point


@given(key_records())
def test_f5_key_state_follows_its_table(case: tuple[KeyRecord, dict[str, Any]]) -> None:
    existing, facts = case
    assert key_state(existing, NOW) is expected_state(facts)


@given(key_records())
def test_f5_in_progress_exactly_when_processing_for_a_matching_unfinished_key(
    case: tuple[KeyRecord, dict[str, Any]],
) -> None:
    existing, facts = case
    if facts["finished"] or not facts["same"]:
        return
    in_progress = arbitrate(existing, FP, NOW) is Outcome.IN_PROGRESS
    assert in_progress == (key_state(existing, NOW) is KeyState.PROCESSING)
