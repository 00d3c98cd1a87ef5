"""The engine's third step kind, the application handler (F6), and the wait for a twin
(P10) that every run shares.

A handler run claims the key, runs the application with no transaction of the store
open (so it works on any key store), and settles the key by the response's status
(R5): a terminal answer is stored, a rejected request is forgotten so the client can
correct it, a server error is released (stored with ``store_server_errors``). An
exception of the handler releases the key (or stores the server error) and
propagates to the caller, whose framework answers it.

An answer is sent only once it is stored (DESIGN 13): when the finish fails after the
handler ran, the answer is withheld and the run fails with
[`AnswerNotStored`][idempotence.errors.AnswerNotStored] (503 over HTTP), whether the
finish landed is unknown, so the finish is tried again in the background
([`DoFinishLater`][idempotence.flows.effects.DoFinishLater]) while the key stays
locked: a retry is told the key is in progress, then gets the stored answer replayed.
Only if the store stays out of reach until the lock lapses does a retry take the key
over and run the request again (P5). A finish refused because the key was taken
over is LOST: that answer is not the key's. A failed release or forget (an answer
that is not stored anyway) is logged, and the lock expires.

While the handler runs, the driver extends its lock every
[`beat_every`][idempotence.flows.steps.HandlerStep.beat_every] seconds (F2), fenced: a
live handler is never taken over, so the lock timeout can be short. A beat refused means
another worker took the key over (the handler stalled past the lock timeout): beating
stops, and the settle is refused the same way, so the stalled handler's answer is not
stored.

In a request-as-transaction flow (F3) the handler is instead the body of the one
atomic phase: the claim opens the transaction, and the response is finished at its
COMMIT, or everything rolls back.

```python
flow = Flow("http", store_server_errors=False)
flow.handler(limit=1 << 20)
result = drive_async(flow.engine(request, app=exchange), store)
```
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Generator
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import Any, Protocol

from .._frozen import quick_new
from ..errors import AnswerNotStored, IdempotenceError, LockLost, StoreError, StoreUnavailable
from ..problems import Problem, ProblemDetails
from ..states import Claim, ClaimRequest, Lease, Outcome
from .contexts import FlowInfo
from .effects import (
    DoClaim,
    DoFinish,
    DoFinishLater,
    DoForget,
    DoInTransaction,
    DoRelease,
    DoWait,
    Effect,
    Engine,
    HandlerBody,
    OverflowNotStored,
    new_do_claim,
    new_do_finish,
    new_do_handle,
)
from .results import (
    SERVER_ERROR,
    STORED_SERVER_ERROR,
    Captured,
    FlowResult,
    ResultKind,
    from_claim,
    new_result,
)
from .steps import UNLIMITED, HandlerStep, Settle


class Flow(FlowInfo, Protocol):
    """What a handler run knows of its flow (a [`Flow`][idempotence.testing.harness.Flow])."""

    store_server_errors: bool
    lock_timeout: timedelta


logger = logging.getLogger("idempotence.flows")

# The enum members the request path compares with, as module globals: a member read
# off its enum class goes through the metaclass's attribute lookup, about five times
# a global's cost.
_EXECUTE, _REPLAY = Outcome.EXECUTE, Outcome.REPLAY
_STORE = Settle.STORE
_EXECUTED = ResultKind.EXECUTED

FIRST_POLL, MAX_POLL = 0.005, 0.25
"""The first pause of a wait for a twin, and the longest (P10): the pauses double."""


# -- P10: the wait for a twin, once for every kind of run --------------------------------------


class Waiter:
    """The pauses of a bounded wait for a twin (P10): ``first``, doubling up to ``cap``,
    until ``wait`` is over."""

    __slots__ = ("cap", "deadline", "delay")

    def __init__(self, wait: timedelta, first: float = FIRST_POLL, cap: float = MAX_POLL) -> None:
        self.deadline = time.monotonic() + wait.total_seconds()
        self.delay, self.cap = first, cap

    def pause(self) -> float | None:
        """Seconds to wait before trying again, or None: the wait is over."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            return None
        pause, self.delay = min(self.delay, left), min(self.delay * 2, self.cap)
        return pause


def rotated(request: ClaimRequest, claim: Claim) -> bool:
    """True when ``claim`` is a MISMATCH only because the key was stored under the
    previous fingerprint secret: the same request, to be claimed again with the
    fingerprint the key has."""
    previous = request.previous_fingerprint
    return (
        previous is not None
        and claim.outcome is Outcome.MISMATCH
        and claim.record.fingerprint == previous
    )


def claimed(request: ClaimRequest, wait: timedelta | None) -> Generator[Effect, Any, Claim]:
    """Claim the key; with ``wait``, a key in progress elsewhere is waited for (outside
    any transaction, F8) and claimed again until it settles or the wait is over."""
    claim: Claim = yield new_do_claim(request)
    if claim.outcome is Outcome.EXECUTE or claim.outcome is Outcome.REPLAY:
        return claim
    return (yield from claimed_again(request, claim, wait))


def claimed_again(
    request: ClaimRequest, claim: Claim, wait: timedelta | None
) -> Generator[Effect, Any, Claim]:
    """The rest of `claimed` after a first claim that neither won nor replayed:
    claimed again under the key's fingerprint while secrets rotate, and waited for
    while in progress (a run that claims in line calls it after its own first claim)."""
    if rotated(request, claim):
        request = replace(request, fingerprint=claim.record.fingerprint)
        claim = yield DoClaim(request)
    if claim.outcome is not Outcome.IN_PROGRESS or wait is None:
        return claim
    waiter = Waiter(wait)
    while (pause := waiter.pause()) is not None:
        yield DoWait(request, pause)
        claim = yield DoClaim(request)
        if claim.outcome is not Outcome.IN_PROGRESS:
            break
    return claim


def in_transaction(
    effect: DoInTransaction, wait: timedelta | None
) -> Generator[Effect, Any, tuple[Claim, Any]]:
    """Perform ``effect`` (F3); with ``wait``, a key in progress elsewhere is waited
    for between two transactions, never inside one (F8), and tried again."""
    claim, outcome = yield effect
    return (yield from in_transaction_again(effect, claim, outcome, wait))


def in_transaction_again(
    effect: DoInTransaction, claim: Claim, outcome: Any, wait: timedelta | None
) -> Generator[Effect, Any, tuple[Claim, Any]]:
    """The rest of `in_transaction` after its first transaction ended in ``claim`` and
    ``outcome`` (a run that performs its first in line calls it after a claim that
    neither won nor replayed)."""
    waiter: Waiter | None = None
    while True:
        if rotated(effect.request, claim):  # the transaction claimed nothing: again
            request = replace(effect.request, fingerprint=claim.record.fingerprint)
            effect = replace(effect, request=request)
            claim, outcome = yield effect
        if claim.outcome is not Outcome.IN_PROGRESS or wait is None:
            return claim, outcome
        waiter = waiter or Waiter(wait)
        pause = waiter.pause()
        if pause is None:
            return claim, outcome
        yield DoWait(effect.request, pause, poll=claim.held)
        claim, outcome = yield effect


# -- the handler, outside any transaction -----------------------------------------------------


def run_handler(
    flow: Flow, step: HandlerStep, request: ClaimRequest, app: Any, wait: timedelta | None
) -> Engine:
    try:
        # claimed(), in line for the first claim: a sub-generator per run costs more
        # than a guarded function's whole decision.
        claim = yield new_do_claim(request)
        if claim.outcome is not _EXECUTE and claim.outcome is not _REPLAY:
            claim = yield from claimed_again(request, claim, wait)
    except StoreError as exc:
        # Nothing was claimed and nothing ran (P11): the entry point answers, or runs
        # the handler unguarded if it opted in.
        return FlowResult(ResultKind.FAILED, None, SERVER_ERROR, error=exc)
    if claim.outcome is not _EXECUTE:
        return from_claim(claim)
    lease = claim.lease
    assert lease is not None
    # An app that never answers too much for the store (UNLIMITED) is given no overflow.
    on_overflow = partial(overflowed, flow, step, lease) if step.limit < UNLIMITED else None
    try:
        captured: Captured = yield new_do_handle(
            app, lease, step.limit, on_overflow, step.beat_every(flow.lock_timeout)
        )
    except GeneratorExit:
        raise
    except OverflowNotStored as exc:
        # Too large to store, and the problem a retry would be told could not be
        # stored: the response was not sent, as any answer whose finish failed.
        if isinstance(exc.error, LockLost):
            logger.warning("key was taken over while the handler ran: %s", exc.error)
            return FlowResult(ResultKind.LOST, claim, error=exc.error)
        return (yield from _unstored(flow, step, exc.finish, claim, exc.error))
    except Exception:
        # R5: an exception stores nothing (unless the run stores server errors), so a
        # retry runs the request again; the caller answers the exception.
        failed = DoFinish(lease, STORED_SERVER_ERROR) if flow.store_server_errors else None
        yield from _settle(failed or DoRelease(lease))
        raise
    except BaseException:
        # Cancelled (the client went away) or interrupted: unlock the key so that a
        # retry need not wait out the lock timeout.
        with contextlib.suppress(Exception):
            yield DoRelease(lease)
        raise
    if captured.overflowed:
        return FlowResult(ResultKind.SENT, claim)
    action = step.settle(captured.status, flow.store_server_errors)
    if action is _STORE:
        stored = step.stored(captured)
        # The answer as the app made it: the stored one when that is the app's own
        # with every header kept as it was sent (a guarded function's), so one
        # response is made, not two.
        same = step.fixed_response is None and stored.headers == captured.headers
        response = stored if same else captured.response()
        finish = new_do_finish(lease, stored, None)
        try:
            yield finish
        except LockLost as exc:
            # Another worker took the key over (this handler stalled past the lock):
            # its run's answer is the key's, not this one.
            logger.warning("key was taken over while the handler ran: %s", exc)
            return FlowResult(ResultKind.LOST, claim, error=exc)
        except StoreError as exc:
            return (yield from _unstored(flow, step, finish, claim, exc))
        # Every field, in order (stored=True, no error, answered=True), past the class
        # call: once per executed call.
        return new_result(_EXECUTED, claim, response, True, None, True)
    response = captured.response()
    if action is Settle.RELEASE:
        yield from _settle(DoRelease(lease))
        return FlowResult(ResultKind.FAILED, claim, response, answered=True)
    yield from _settle(DoForget(lease))
    return FlowResult(ResultKind.REJECTED, claim, response, answered=True)


def _unstored(
    flow: Flow, step: HandlerStep, finish: DoFinish, claim: Claim, exc: IdempotenceError
) -> Engine:
    """The finish failed after the handler ran: the answer may or may not be stored,
    so it is not sent (an answer sent is always one a retry gets replayed). The
    finish goes on in the background while the key stays locked."""
    logger.warning(
        "could not store the answer of key %r after the handler ran, so it is not sent; "
        "storing it again in the background: %s",
        finish.lease.key,
        exc,
    )
    lock = flow.lock_timeout
    yield DoFinishLater(finish, lock.total_seconds(), step.beat_every(lock))
    error = AnswerNotStored(
        f"the request ran, but its answer could not be stored ({exc}): it is being "
        "stored again in the background; retry with the same key to get it"
    )
    error.__cause__ = exc
    return FlowResult(ResultKind.FAILED, claim, SERVER_ERROR, error=error)


FIRST_TRY, MAX_TRY_PAUSE = 0.05, 0.25
"""The first pause of a finish tried again in the background, and the longest: the
pauses double (short: a retry should find the answer stored soon after a heal)."""


class LateFinish(Waiter):
    """When a finish tried again in the background
    ([`DoFinishLater`][idempotence.flows.effects.DoFinishLater]) tries next (`pause`:
    None once it gives up), beats, and gives up.

    It gives up once the lock has lapsed by this process's clock: the lock can last
    no longer than ``lock_timeout`` after the first finish failed (every beat before
    it was sent earlier), nor after the last beat that landed since. A finish after
    that could still land (if no retry took the key over), but by then a retry may
    run the request again, so the key is the retry's.
    """

    __slots__ = ("beat_at", "beat_every", "lock_timeout")

    def __init__(self, lock_timeout: float, beat_every: float) -> None:
        super().__init__(timedelta(seconds=lock_timeout), FIRST_TRY, MAX_TRY_PAUSE)
        self.lock_timeout, self.beat_every = lock_timeout, beat_every
        self.beat_at = time.monotonic() + beat_every

    def beat_due(self) -> bool:
        """Whether to extend the lock now (a beat failed is tried again at once)."""
        return time.monotonic() >= self.beat_at

    def beaten(self, sent_at: float) -> None:
        """A beat sent at ``sent_at`` (monotonic) landed: the lock lasts from then."""
        self.deadline = max(self.deadline, sent_at + self.lock_timeout)
        self.beat_at = sent_at + self.beat_every


def _settle(effect: DoFinish | DoRelease | DoForget) -> Generator[Effect, Any, None]:
    """Settle the key after the handler ran with an answer that is not a stored one
    (released, forgotten, or an exception's stored server error, which the caller
    answers itself): a failure cannot change that answer, so it is logged; the lock
    then expires and a retry takes the key over (P5)."""
    try:
        yield effect
    except LockLost as exc:
        logger.warning("key was taken over while the handler ran: %s", exc)
    except StoreError as exc:
        logger.error("could not settle the key after the handler ran: %s", exc, exc_info=exc)


def overflowed(
    flow: Flow, step: HandlerStep, lease: Lease, status: int
) -> DoFinish | DoRelease | DoForget:
    """How a key settles when its handler's response is too large to store: the
    handler's effects happened, so the response is sent once, streamed, and never
    stored truncated. A key that would have been stored is finished with a problem
    instead, marked errored for an operator (the limit is too small), so that a retry
    is told what happened and never runs the request a second time."""
    action = step.settle(status, flow.store_server_errors)
    if action is Settle.RELEASE:
        return DoRelease(lease)
    if action is Settle.FORGET:
        return DoForget(lease)
    limit = step.limit
    detail = (
        f"This request was processed once, but its response was larger than this endpoint "
        f"stores ({limit} bytes), so it cannot be replayed. It will not be processed "
        "again: look its result up through the API."
    )
    response = ProblemDetails.of(Problem.RESPONSE_NOT_REPLAYABLE, detail).stored()
    reason = f"response with status {status} larger than max_response_bytes={limit}: sent once"
    return DoFinish(lease, response, error=reason)


# -- the handler as the body of the one atomic phase (F3) --------------------------------------

# Every request-as-transaction builds its effect and body: past the class call (see
# quick_new).
_new_in_transaction = quick_new(DoInTransaction)
_new_body = quick_new(HandlerBody)


def run_handler_in_transaction(
    flow: Flow, step: HandlerStep, request: ClaimRequest, app: Any, wait: timedelta | None
) -> Engine:
    """F3: the claim, the handler's writes and its stored response commit together. A
    duplicate racing it on PostgreSQL does not wait for that transaction with a pooled
    connection (F8): it is IN_PROGRESS (409), or with ``wait`` polls outside any
    transaction and replays once the first commits (executes if it rolled back). On
    SQLite it waits for the one write lock, on its own connection, as every writer
    does while a transaction is open."""
    effect = _new_in_transaction(request, flow, _new_body(app, step, flow.store_server_errors))
    try:
        # in_transaction(), in line for the first transaction (as run_handler claims):
        # a sub-generator per run costs more than its one decision here.
        claim, outcome = yield effect
        if claim.outcome is not _EXECUTE and claim.outcome is not _REPLAY:
            claim, outcome = yield from in_transaction_again(effect, claim, outcome, wait)
    except StoreError as exc:
        # The claim failed, or the finish was refused (the key was taken over) or the
        # commit lost its connection: everything rolled back, or whether it took
        # effect is unknown; either way a retry is safe.
        return FlowResult(ResultKind.FAILED, None, SERVER_ERROR, error=exc)
    if claim.outcome is not _EXECUTE:
        return from_claim(claim)
    if isinstance(outcome, StoreUnavailable):
        # The database went away under the handler's own statement: its transaction,
        # the claim with it, is gone. A store failure like any other (503), not the
        # application's bug.
        return FlowResult(ResultKind.FAILED, None, SERVER_ERROR, error=outcome)
    if isinstance(outcome, BaseException):
        raise outcome  # the handler's, after everything rolled back with its claim
    assert isinstance(outcome, Captured)
    if outcome.overflowed:
        detail = (
            f"The response was larger than this endpoint can store ({step.limit} bytes), "
            "so the request was rolled back and nothing was done. Retrying it will fail "
            "the same way; contact the operator."
        )
        too_large = ProblemDetails.of(Problem.RESPONSE_TOO_LARGE, detail).stored()
        return FlowResult(ResultKind.REJECTED, None, too_large)
    response = outcome.response()
    if step.settle(outcome.status, flow.store_server_errors) is not _STORE:
        # R5: rolled back, claim included, so nothing is left to settle.
        kind = ResultKind.FAILED if outcome.status >= 500 else ResultKind.REJECTED
        return FlowResult(kind, None, response, answered=True)
    return new_result(_EXECUTED, claim, response, True, None, True)
