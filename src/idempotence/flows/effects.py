"""What the engine asks its driver to do (the driver is generated:
`_driver_async` and `_driver`). One vocabulary for every run: a flow's,
an HTTP handler's, a request-as-transaction endpoint's (F6)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeAlias

from .._frozen import quick_init, quick_new
from ..errors import IdempotenceError
from ..states import STARTED, ClaimRequest, KeyRecord, Lease, StoredResponse
from .contexts import FlowInfo, PhaseContext
from .results import Captured, FlowResult
from .steps import ForeignStep, HandlerStep, PhaseFn, Settle

# -- effects: what the engine asks its driver to do ---------------------------------------


@quick_init
@dataclass(frozen=True, slots=True)
class DoClaim:
    """Claim ``request``'s key; the driver returns the [`Claim`][idempotence.Claim]."""

    request: ClaimRequest


@quick_init
@dataclass(frozen=True, slots=True)
class DoPhase:
    """Run ``fn`` in a transaction, then close the phase; the driver returns
    ``(PhaseResult, Lease)``."""

    fn: Callable[..., Any]
    context: PhaseContext
    with_result: bool

    def event(self, moment: str) -> str:
        """The observer's name for this phase at ``moment``, by its step's recovery
        point."""
        return f"phase:{self.context.lease.recovery_point}:{moment}"


@quick_init
@dataclass(frozen=True, slots=True)
class DoCall:
    """Run a foreign call outside any transaction; the driver returns its value."""

    flow: FlowInfo
    step: ForeignStep
    record: KeyRecord
    lease: Lease

    def event(self, moment: str) -> str:
        return f"call:{self.step.name}:{moment}"


@quick_init
@dataclass(frozen=True, slots=True)
class DoHandle:
    """Run the application handler with no transaction of the store open (F6): the
    driver returns ``app.run_app(self, None, overflow)``, a
    [`Captured`][idempotence.http.wsgi.Captured].

    ``app`` is the entry point's (an HTTP exchange): it runs the application with
    ``lease`` (and the transaction it is given) bound, and buffers the response up to
    ``limit`` body bytes. Past it, with ``on_overflow``, it calls ``overflow(status)``,
    which performs the store effect ``on_overflow(status)``, then streams the response
    through; without, it discards the rest. Either way it returns
    ``Captured(overflowed=True)``. A failed release or forget is logged (that answer
    is not stored anyway); a failed finish raises `OverflowNotStored` out of
    ``overflow`` before anything is sent, and the driver throws it into the engine in
    place of the app's result, even if the app swallowed it: an answer is sent only
    once it is stored (DESIGN 13).

    With ``beat_every``, the driver extends the lock (``store.heartbeat(lease)``,
    fenced) every ``beat_every`` seconds while the app runs, and stops before it
    returns, and before the overflow settles the key (F2).
    """

    app: Any
    lease: Lease
    limit: int
    on_overflow: Callable[[int], Effect] | None
    beat_every: float | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class HandlerBody:
    """The body of a request-as-transaction run of a handler (F3): the driver runs
    ``app`` in the claim's transaction (as for
    [`DoHandle`][idempotence.http.wsgi.DoHandle], without overflow), and commits what
    [`keep`][idempotence.flows.effects.HandlerBody.keep] says to store, finished at the
    COMMIT; when it keeps nothing, or the app raised, everything rolls back, the claim
    with it."""

    app: Any
    step: HandlerStep
    store_server_errors: bool

    def keep(self, captured: Captured) -> StoredResponse | None:
        """The response to commit with the claim, or None: roll back (R5)."""
        if captured.overflowed:
            return None  # nothing was sent yet, so the request can be refused whole
        step = self.step
        if step.settle(captured.status, self.store_server_errors) is not Settle.STORE:
            return None  # a rejected or failed request leaves nothing, not even its claim
        return step.stored(captured)


@quick_init
@dataclass(frozen=True, slots=True)
class DoInTransaction:
    """F3: claim, run ``fn`` and store its response in one transaction.

    For a phase, the driver returns ``(Claim, PhaseResult | None)``; for a handler
    ([`HandlerBody`][idempotence.flows.effects.HandlerBody]), ``(Claim, Captured |
    Exception | None)``: the app's exception is returned, not raised, once everything
    rolled back, so that a store failure (raised) is never taken for the app's."""

    request: ClaimRequest
    flow: FlowInfo
    fn: PhaseFn | HandlerBody

    def event(self, moment: str) -> str:
        return f"phase:{STARTED}:{moment}"


@quick_init
@dataclass(frozen=True, slots=True)
class DoCheckpoint:
    """Commit ``recovery_point`` in a transaction of its own, with ``calling`` (the
    non-idempotent call about to begin, R6) or clearing it; the driver returns the
    advanced lease."""

    lease: Lease
    recovery_point: str
    calling: str | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class DoFinish:
    """Store ``response`` and unlock the key, fenced by ``lease``; ``error`` marks the key
    errored (R6)."""

    lease: Lease
    response: StoredResponse
    error: str | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class DoFinishLater:
    """Perform ``finish`` again in the background, until it lands or the lock lapses:
    its first try failed after the handler ran, so its answer was not sent. The driver
    starts a task (async) or a thread (sync) and returns None at once; it tries the
    finish again every little while, fenced by the lease (a retry that took the key
    over refuses it), and beats every ``beat_every`` seconds meanwhile so that the key
    stays locked (the lock lasts ``lock_timeout`` seconds after a beat lands). See
    `LateFinish` (in `idempotence.flows.handler`)."""

    finish: DoFinish
    lock_timeout: float
    beat_every: float


class OverflowNotStored(Exception):
    """The finish of a response too large to store (the problem a retry is told)
    failed, so the response was not sent: thrown into the engine from
    [`DoHandle`][idempotence.http.wsgi.DoHandle] with the ``finish`` and the store's
    ``error``. Never the application's: an
    [`AnswerNotStored`][idempotence.errors.AnswerNotStored] raised by the handler (a
    guarded function it called) is the handler's exception like any other."""

    def __init__(self, finish: DoFinish, error: IdempotenceError) -> None:
        super().__init__(f"the finish of a response too large to store failed: {error}")
        self.finish, self.error = finish, error


@quick_init
@dataclass(frozen=True, slots=True)
class DoRelease:
    """Unlock the key without storing an answer, fenced by ``lease``: a retry runs it
    again (R5)."""

    lease: Lease


@quick_init
@dataclass(frozen=True, slots=True)
class DoForget:
    """Delete the key, fenced by ``lease``: the request was refused as sent, so the
    client may correct it and retry with the same key (R5)."""

    lease: Lease


@quick_init
@dataclass(frozen=True, slots=True)
class DoWait:
    """P10: wait up to ``seconds`` for the twin holding ``request``'s key to settle,
    outside any transaction (F8): ``store.wait_for_settle``, which may return early
    (PostgreSQL: a NOTIFY); the engine then claims again. A store that does not
    declare ``Capability.WAITING`` is not asked: the driver sleeps ``seconds``."""

    request: ClaimRequest
    seconds: float
    poll: bool = False
    """Sleep ``seconds`` without asking to be woken: the twin's open transaction holds
    the key (``Claim.held``), and no notification can be asked of a row it holds."""


# The effects every handler run yields, built from every field past the class call
# (see quick_new): the claim, the handler, the finish.
new_do_claim = quick_new(DoClaim)
new_do_handle = quick_new(DoHandle)
new_do_finish = quick_new(DoFinish)


Effect: TypeAlias = (
    DoClaim
    | DoPhase
    | DoCall
    | DoHandle
    | DoInTransaction
    | DoCheckpoint
    | DoFinish
    | DoFinishLater
    | DoRelease
    | DoForget
    | DoWait
)
"""Any effect the engine may ask its driver to perform."""
Engine: TypeAlias = Generator[Effect, Any, FlowResult]
"""A run of the engine: it yields effects, is sent each one's outcome, and returns the
run's [`FlowResult`][idempotence.flows.FlowResult]."""
