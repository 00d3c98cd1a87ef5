"""The steps a flow is made of: atomic phases, foreign calls and the application's
own handler (R1-R6, F6)."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeAlias

from ..errors import Indeterminate
from ..states import StoredResponse
from .contexts import ForeignContext, PhaseContext
from .results import Captured, PhaseResult

# -- steps ------------------------------------------------------------------------------

PhaseFn: TypeAlias = Callable[[PhaseContext], "PhaseResult | Awaitable[PhaseResult]"]
CallFn: TypeAlias = Callable[[ForeignContext], Any]
RecordFn: TypeAlias = Callable[[PhaseContext, Any], "PhaseResult | Awaitable[PhaseResult]"]


@dataclass(frozen=True, slots=True)
class AtomicStep:
    recovery_point: str
    fn: PhaseFn


@dataclass(frozen=True, slots=True)
class ForeignStep:
    recovery_point: str
    name: str
    call: CallFn
    record: RecordFn
    idempotent: bool


class Settle(enum.Enum):
    """What becomes of a key after its handler answered (R5)."""

    #: A terminal answer (2xx, 3xx, most 4xx; a 5xx with ``store_server_errors``).
    STORE = "store"
    #: A server error: unlocked, so a retry runs the request again.
    RELEASE = "release"
    #: The request was refused as sent: the key is deleted, so the client can correct
    #: the request and retry with the same key.
    FORGET = "forget"


@dataclass(frozen=True, slots=True)
class HandlerStep:
    """The application's own handler as the one step of a run (F6).

    It runs with no transaction of the store open, so on any key store (Redis too),
    and its response settles the key by its status (R5, :meth:`settle`); in a
    request-as-transaction flow it is the body of the one atomic phase instead (F3).
    A response body over ``limit`` bytes is never stored truncated. While the handler
    runs, the driver extends its lock every ``heartbeat`` (F2; see :meth:`beat_every`).
    """

    recovery_point: str
    #: Responses with a larger body are not stored.
    limit: int
    #: 4xx statuses that store nothing, so the client can fix the request and retry.
    rejected_statuses: frozenset[int]
    #: The response headers (lower-case) kept for replay.
    stored_headers: frozenset[str]
    #: How often the lock is extended while the handler runs; None: a third of the
    #: lock timeout, so that two beats can be late before a retry may take it over.
    heartbeat: timedelta | None = None
    #: The response stored by every run that stores one, known before the handler runs
    #: (a consumer's acknowledgement): a request-as-transaction run writes it with its
    #: claim, so its COMMIT carries no finish (F3).
    fixed_response: StoredResponse | None = None

    def beat_every(self, lock_timeout: timedelta) -> float:
        """Seconds between two heartbeats of a run whose lock lasts ``lock_timeout``."""
        return (self.heartbeat or lock_timeout / 3).total_seconds()

    def settle(self, status: int, store_server_errors: bool) -> Settle:
        """What becomes of the key after the handler answered ``status`` (R5)."""
        if status >= 500:
            return Settle.STORE if store_server_errors else Settle.RELEASE
        if status in self.rejected_statuses:
            return Settle.FORGET
        return Settle.STORE

    def stored(self, captured: Captured) -> StoredResponse:
        """The response as stored for replay: status, kept headers only, body (or
        the fixed response)."""
        if self.fixed_response is not None:
            return self.fixed_response
        allowed = self.stored_headers
        kept = []
        for name, value in captured.headers:
            name = name.lower()
            if name in allowed:
                kept.append((name, value))
        return StoredResponse(captured.status, tuple(kept), captured.body)


Step: TypeAlias = AtomicStep | ForeignStep | HandlerStep

#: A foreign call's failures that leave its outcome unknown (R6).
INDETERMINATE = (Indeterminate, TimeoutError, ConnectionError)
