"""The key state machine: records, claim arbitration and state names, with no I/O.

Every store executes these rules; none re-implements them. A store that can run the
whole claim in one SQL statement (PostgreSQL) encodes the takeover predicate of
[`arbitrate`][idempotence.states.arbitrate] in that statement, and then classifies the
row it got back with [`arbitrate`][idempotence.states.arbitrate] itself, so the two can
never disagree silently (the conformance suite checks both).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from ._frozen import quick_init, quick_new

STARTED = "started"
"""The recovery point of a key that has just been claimed for the first time."""
FINISHED = "finished"
"""The recovery point of a key whose response is stored."""

DEFAULT_LOCK_TIMEOUT = timedelta(seconds=60)
"""A flow's lock timeout (``Flow(lock_timeout=)``): its phases are not beaten for."""
DEFAULT_HANDLER_LOCK_TIMEOUT = timedelta(seconds=10)
"""A plain HTTP endpoint's (``Policy(lock_timeout=)``): its handler's lock is extended
every third of it while it runs (F2), so a live handler is never taken over, and a
retry after a crash runs within about 10 seconds instead of waiting out a long lock."""
DEFAULT_RETENTION = timedelta(hours=24)

JSON = Any
"""A value that `json.dumps` accepts."""


class Outcome(enum.Enum):
    """What a claim tells the request that made it (DESIGN 4, P1–P5)."""

    EXECUTE = "execute"
    """Run the flow from ``record.recovery_point``; the caller holds the lock (P1, P5)."""
    MISMATCH = "mismatch"
    """The key was used for a different request: answer 422 (P2)."""
    REPLAY = "replay"
    """The key is finished: answer with the stored response (P3)."""
    IN_PROGRESS = "in_progress"
    """Another worker holds a live lock: answer 409 with Retry-After (P4)."""


class KeyState(enum.Enum):
    """The observable state of a key (F5)."""

    PENDING = "pending"
    """Unlocked and unfinished: a crashed or abandoned run, waiting for a retry or the
    completer."""
    PROCESSING = "processing"
    """Locked by a worker whose lock has not expired."""
    COMPLETE = "complete"
    """Finished with a response below 400."""
    FAILED = "failed"
    """Finished with a stored error response (a declined card, a validation error
    after the first phase)."""
    ERRORED = "errored"
    """Finished after an indeterminate foreign failure; needs a human (R6)."""
    EXPIRED = "expired"
    """Past ``expires_at`` and not locked: the reaper's to remove."""


@quick_init
@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A response as stored for replay: status, headers (ordered pairs) and body."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    @classmethod
    def of(
        cls,
        status: int,
        headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        body: bytes | str = b"",
    ) -> StoredResponse:
        """Build a response from friendlier types (a header mapping, a text body)."""
        pairs = tuple(headers.items()) if isinstance(headers, Mapping) else tuple(headers)
        raw = body.encode() if isinstance(body, str) else bytes(body)
        return cls(status=status, headers=tuple((str(k), str(v)) for k, v in pairs), body=raw)


@quick_init
@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A snapshot of one key row (DESIGN 3). Times come from the database clock."""

    id: int
    scope: str
    key: str
    method: str
    path: str
    fingerprint: str
    params: JSON
    flow: str
    recovery_point: str
    lock_token: int
    locked_at: datetime | None
    lock_timeout: timedelta
    response: StoredResponse | None
    error: str | None
    created_at: datetime
    last_run_at: datetime | None
    finished_at: datetime | None
    expires_at: datetime | None
    calling: str | None = None
    """The non-idempotent foreign call this key's worker began and has not recorded
    (R6), or None. A claim that finds it set learns that a worker died during the
    call; the recovery point stays the call's step's own."""

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    def lock_expires_at(self) -> datetime | None:
        """When the current lock stops protecting its holder, or None if unlocked."""
        return None if self.locked_at is None else self.locked_at + self.lock_timeout

    def lock_is_live(self, now: datetime) -> bool:
        expires = self.lock_expires_at()
        return expires is not None and expires > now


@quick_init
@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Everything a claim needs to know about the request (DESIGN 4).

    ``params`` is what the completer needs to re-run the flow later (B2); it is stored
    as JSON on the first claim and never changed by later ones.
    """

    scope: str
    key: str
    fingerprint: str
    method: str = "POST"
    path: str = "/"
    flow: str = "default"
    params: JSON = field(default_factory=dict)
    lock_timeout: timedelta = DEFAULT_LOCK_TIMEOUT
    retention: timedelta | None = DEFAULT_RETENTION
    """How long a key is kept; ``None`` keeps it forever (ledgers)."""
    previous_fingerprint: str | None = None
    """The request's fingerprint under the previous fingerprint secret, while secrets
    rotate: a key stored under it is this request too (the engine claims it again with
    this fingerprint), so a retry across the rotation replays instead of 422."""


@quick_init
@dataclass(frozen=True, slots=True)
class Lease:
    """Proof that this worker holds a key's lock: the fencing token (F1).

    Every fenced write names ``(scope, id, token)``; a takeover bumps the row's token,
    after which writes made with this lease are refused with
    [`LockLost`][idempotence.maintenance.completer_async.LockLost].
    """

    id: int
    scope: str
    key: str
    token: int
    recovery_point: str
    calling: str | None = None
    """The non-idempotent foreign call begun at ``recovery_point`` and not recorded
    (R6): set by the checkpoint just before the call, cleared by every other one."""

    def advanced(self, recovery_point: str, calling: str | None = None) -> Lease:
        """The lease after a fenced write committed ``recovery_point`` (and
        ``calling``, which every write but the one before a call clears)."""
        return replace(self, recovery_point=recovery_point, calling=calling)


@quick_init
@dataclass(frozen=True, slots=True)
class Claim:
    """The single outcome a claim produced, and what the caller needs to act on it."""

    outcome: Outcome
    record: KeyRecord
    lease: Lease | None = None
    """Set when ``outcome`` is EXECUTE."""
    retry_after: float | None = None
    """Set when ``outcome`` is IN_PROGRESS: seconds until the holder's lock expires."""
    held: bool = False
    """True with IN_PROGRESS when another request's open transaction holds the key
    (request-as-transaction, F3): nothing about it can be read, nor a notification
    asked for, until that transaction ends, so a wait for it polls (F8)."""

    @property
    def response(self) -> StoredResponse | None:
        """The stored response, for REPLAY."""
        return self.record.response

    @property
    def took_over(self) -> bool:
        """Whether this claim took an existing key over (P5): an earlier claim held
        it, and its lock expired or was released (a crash, a sweep, a failed run), so
        the fencing token was bumped past the first claim's 1."""
        return self.lease is not None and self.lease.token > 1


@quick_init
@dataclass(frozen=True, slots=True)
class StagedJob:
    """A job a phase staged (R7): delivered after its phase commits, deduplicated by
    ``job_key`` on the runner's side."""

    id: int
    job_key: str
    scope: str
    key_id: int
    name: str
    args: JSON
    created_at: datetime


def arbitrate(record: KeyRecord | None, fingerprint: str, now: datetime) -> Outcome:
    """Decide a claim's outcome from the existing row, in DESIGN's order of precedence.

    ```python
    arbitrate(None, "f" * 64, now)
    # <Outcome.EXECUTE: 'execute'>              # P1: a new key
    ```

    ``now`` must come from the same clock that wrote ``record.locked_at`` (the database).
    """
    if record is None:
        return Outcome.EXECUTE  # P1
    outcome = settled(record, fingerprint)
    if outcome is not None:
        return outcome
    if record.lock_is_live(now):
        return Outcome.IN_PROGRESS  # P4
    return Outcome.EXECUTE  # P5: unlocked, or the holder's lock expired: take over


def settled(record: KeyRecord, fingerprint: str) -> Outcome | None:
    """What a key's row decides whatever its lock says, in
    [`arbitrate`][idempotence.states.arbitrate]'s order: MISMATCH for another request's
    key (P2), REPLAY for a finished one (P3); None for an unfinished key of this
    request, which its lock decides (P4, P5). A reader that does not claim (a status
    URL's GET) asks this, not the clock.

    Args:
        record: the key's row.
        fingerprint: the fingerprint of the request asking.

    Returns:
        ``Outcome.MISMATCH``, ``Outcome.REPLAY``, or None when the lock decides.
    """
    # P2 before P3: replaying another request's response would be a lie.
    if record.fingerprint != fingerprint:
        return Outcome.MISMATCH
    if record.finished:
        return Outcome.REPLAY  # P3
    return None


# Every claim builds its Lease and Claim here: past the class call (see quick_new).
_new_lease = quick_new(Lease)
# A global: a member read off its enum class goes through the metaclass's lookup.
_EXECUTE = Outcome.EXECUTE
_new_claim = quick_new(Claim)
new_response = quick_new(StoredResponse)
"""A StoredResponse from status, headers and body, past the class call (see
`quick_new`): a store reading one back, a handler's answer kept for storing."""


def claim_from(record: KeyRecord, fingerprint: str, now: datetime, *, claimed: bool) -> Claim:
    """Build the [`Claim`][idempotence.states.Claim] for a row a store has just inserted or read.

    ``claimed`` says whether the store's write took the lock. For a row the store did
    not take, [`arbitrate`][idempotence.states.arbitrate] must not say EXECUTE: that
    would mean the store's predicate and the state machine disagree, which is a bug, not
    a race.
    """
    if claimed:
        # A store whose write skipped the fingerprint check would hand out another
        # request's key: refuse loudly rather than run the wrong request (P2).
        if record.fingerprint != fingerprint:
            raise AssertionError(f"store took key {record.key!r} for a mismatched request")
        lease = _new_lease(
            record.id,
            record.scope,
            record.key,
            record.lock_token,
            record.recovery_point,
            record.calling,
        )
        return _new_claim(_EXECUTE, record, lease, None, False)
    outcome = arbitrate(record, fingerprint, now)
    if outcome is Outcome.EXECUTE:
        raise AssertionError(
            f"store did not take key {record.key!r} but the state machine says EXECUTE"
        )
    retry_after = None
    expires = record.lock_expires_at()
    if outcome is Outcome.IN_PROGRESS and expires is not None:
        retry_after = max((expires - now).total_seconds(), 0.0)
    return _new_claim(outcome, record, None, retry_after, False)


def key_state(record: KeyRecord, now: datetime) -> KeyState:
    """The observable state of a key at ``now`` (F5).

    The order follows [`arbitrate`][idempotence.states.arbitrate]: a finished key is
    finished whatever its lock fields say, and an errored key stays ERRORED past its
    expiry, because it waits for a human, not for the reaper.
    """
    if record.finished:
        if record.error is not None:
            return KeyState.ERRORED
        if record.expires_at is not None and record.expires_at <= now:
            return KeyState.EXPIRED
        status = record.response.status if record.response is not None else 500
        return KeyState.COMPLETE if status < 400 else KeyState.FAILED
    if record.lock_is_live(now):
        return KeyState.PROCESSING
    if record.expires_at is not None and record.expires_at <= now:
        return KeyState.EXPIRED
    return KeyState.PENDING


@quick_init
@dataclass(frozen=True, slots=True)
class KeyStatus:
    """What a key's status read tells (``store.key_status(scope, key)``): its state
    at ``now``, its times and, once finished, the status code of its stored response.

    Never the stored body or headers: a status is safe to show to whoever may ask
    after the key, and small.

    ```python
    status = KeyStatus.of(record, now)
    status.state, status.response_status
    # (<KeyState.COMPLETE: 'complete'>, 201)
    ```
    """

    scope: str
    key: str
    state: KeyState
    """The key's state at ``now`` ([`key_state`][idempotence.states.key_state]):
    EXPIRED once its retention has passed, even before the reaper deleted it."""
    now: datetime
    """The store's clock when the key was read (the database's, or Redis's)."""
    created_at: datetime
    finished_at: datetime | None
    expires_at: datetime | None
    """When the retention ends (None: kept forever)."""
    response_status: int | None
    """The stored response's status code once finished, else None."""

    @classmethod
    def of(cls, record: KeyRecord, now: datetime) -> KeyStatus:
        """The status of ``record`` at ``now``, a time of the clock that wrote it."""
        response = record.response
        return cls(
            scope=record.scope,
            key=record.key,
            state=key_state(record, now),
            now=now,
            created_at=record.created_at,
            finished_at=record.finished_at,
            expires_at=record.expires_at,
            response_status=None if response is None or not record.finished else response.status,
        )
