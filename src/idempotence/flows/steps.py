"""The steps a flow is made of: atomic phases, foreign calls and the application's
own handler (R1-R6, F6)."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeAlias

from ..errors import Indeterminate
from ..states import StoredResponse, new_response
from .contexts import ForeignContext, PhaseContext
from .results import Captured, PhaseResult

# -- steps ------------------------------------------------------------------------------

PhaseFn: TypeAlias = Callable[[PhaseContext], "PhaseResult | Awaitable[PhaseResult]"]
"""An atomic phase: it runs in one transaction with the key's checkpoint, and says what
comes next (sync or async)."""
CallFn: TypeAlias = Callable[[ForeignContext], Any]
"""A foreign call: it runs outside any transaction, with a key derived from the
request's, and returns what the next phase records."""
RecordFn: TypeAlias = Callable[[PhaseContext, Any], "PhaseResult | Awaitable[PhaseResult]"]
"""The phase that records a foreign call's result, in the transaction of its
checkpoint."""


@dataclass(frozen=True, slots=True)
class AtomicStep:
    """A phase of a flow: ``fn`` runs in one transaction that also moves the key to
    ``recovery_point`` (R2)."""

    recovery_point: str
    fn: PhaseFn


@dataclass(frozen=True, slots=True)
class ForeignStep:
    """A call to another system (R3, R4): ``call`` runs outside any transaction, then
    ``record`` keeps its result in a phase that moves the key to ``recovery_point``.
    A call that is not ``idempotent`` and whose outcome is unknown errors the key for
    a human (R6) instead of being sent again."""

    recovery_point: str
    name: str
    call: CallFn
    record: RecordFn
    idempotent: bool


class Settle(enum.Enum):
    """What becomes of a key after its handler answered (R5)."""

    STORE = "store"
    """A terminal answer (2xx, 3xx, most 4xx; a 5xx with ``store_server_errors``)."""
    RELEASE = "release"
    """A server error: unlocked, so a retry runs the request again."""
    FORGET = "forget"
    """The request was refused as sent: the key is deleted, so the client can correct
    the request and retry with the same key."""


# Settle's members as module globals, for `HandlerStep.settle` (every guarded request):
# a member read off its enum class goes through the metaclass's attribute lookup.
_STORE, _RELEASE, _FORGET = Settle.STORE, Settle.RELEASE, Settle.FORGET


@dataclass(frozen=True, slots=True)
class HandlerStep:
    """The application's own handler as the one step of a run (F6).

    It runs with no transaction of the store open, so on any key store (Redis too), and
    its response settles the key by its status (R5,
    [`settle`][idempotence.flows.steps.HandlerStep.settle]); in a request-as-transaction
    flow it is the body of the one atomic phase instead (F3). A response body over
    ``limit`` bytes is never stored truncated. While the handler runs, the driver
    extends its lock every ``heartbeat`` (F2; see
    [`beat_every`][idempotence.flows.steps.HandlerStep.beat_every]).
    """

    recovery_point: str
    limit: int
    """Responses with a larger body are not stored."""
    rejected_statuses: frozenset[int]
    """4xx statuses that store nothing, so the client can fix the request and retry."""
    stored_headers: frozenset[str]
    """The response headers (lower-case) kept for replay."""
    heartbeat: timedelta | None = None
    """How often the lock is extended while the handler runs; None: a third of the
    lock timeout, so that two beats can be late before a retry may take it over."""
    fixed_response: StoredResponse | None = None
    """The response stored by every run that stores one, known before the handler runs
    (a consumer's acknowledgement): a request-as-transaction run writes it with its
    claim, so its COMMIT carries no finish (F3)."""
    _memo: dict[Any, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    """What every run of the step works out the same (`beat_every` by lock timeout,
    the headers `stored` keeps by the headers sent): looked up, not worked out again
    on each run. The headers are kept for the last headers only, found by identity
    (an app that answers with one tuple, a guarded function's) or by value, so it
    never grows."""

    def beat_every(self, lock_timeout: timedelta) -> float:
        """Seconds between two heartbeats of a run whose lock lasts ``lock_timeout``."""
        seconds: float | None = self._memo.get(lock_timeout)
        if seconds is None:
            seconds = (self.heartbeat or lock_timeout / 3).total_seconds()
            self._memo[lock_timeout] = seconds
        return seconds

    def settle(self, status: int, store_server_errors: bool) -> Settle:
        """What becomes of the key after the handler answered ``status`` (R5)."""
        if status >= 500:
            return _STORE if store_server_errors else _RELEASE
        if status in self.rejected_statuses:
            return _FORGET
        return _STORE

    def stored(self, captured: Captured) -> StoredResponse:
        """The response as stored for replay: status, kept headers only, body (or
        the fixed response)."""
        if self.fixed_response is not None:
            return self.fixed_response
        headers = captured.headers
        last = self._memo.get(_LAST_HEADERS)
        # The same tuple (a guarded function's), or equal headers (an app's that
        # answers alike, sent as a new list each time): compared in C, unlike the loop.
        if last is not None and (last[0] is headers or last[0] == headers):
            return new_response(captured.status, last[1], captured.body)
        allowed = self.stored_headers
        kept = []
        for name, value in headers:
            name = name.lower()
            if name in allowed:
                kept.append((name, value))
        found = tuple(kept)
        if type(headers) is tuple:  # not a list the app could change and send again
            self._memo[_LAST_HEADERS] = (headers, found)  # one item replaced: thread-safe
        return new_response(captured.status, found, captured.body)


_LAST_HEADERS = object()
"""The key of the last headers `HandlerStep.stored` kept, in its memo."""

UNLIMITED = 1 << 62
"""A handler step's ``limit`` for an application whose answers are never too large to
store (a guarded function's: the store refuses what it cannot hold, and the engine
keeps no cap of its own): its runs prepare no overflow."""

Step: TypeAlias = AtomicStep | ForeignStep | HandlerStep
"""Any step of a run."""

INDETERMINATE = (Indeterminate, TimeoutError, ConnectionError)
"""A foreign call's failures that leave its outcome unknown (R6)."""
