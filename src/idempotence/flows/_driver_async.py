"""Perform the engine's effects on a store: the one driver (F6).

The engine ([`engine`][idempotence.flows.flow.Flow.engine]) decides; the driver only does what
it asks and sends back the result, or throws back the exception. Each phase and
foreign call is wrapped in the store's instrumentation (`watch`).

A handler run ([`handler`][idempotence.flows.flow.Flow.handler]) needs only a key store;
phases, foreign calls and request-as-transaction runs need the SQL store, which the
entry point checked ([`run`][idempotence.flows.flow.Flow.run] by type, the HTTP
configuration when it is built).

While a handler runs, the driver beats for it (F2): a task (async) or a thread (sync)
extends the lock with ``store.heartbeat(lease)``, fenced, and is stopped and waited
for before the key is settled. A finish that failed after the handler ran is tried
again in the background, by a task or a thread of its own
([`DoFinishLater`][idempotence.flows.effects.DoFinishLater]).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar, cast

from .._awaitables import settle_async
from .._concurrency import AsyncPeriodic, sleep_async, spawn_async
from ..errors import IdempotenceError, LockLost, StoreError
from ..states import Lease, Outcome
from ..stores import AsyncKeyStore, AsyncStore
from ..stores.capabilities import Capability, capabilities_of
from ._driver_shared import NOT_SYNC, after_call, closing, require_finish, unsent, watch
from .contexts import ForeignContext, Observer, PhaseContext
from .effects import (
    DoCall,
    DoCheckpoint,
    DoClaim,
    DoFinish,
    DoFinishLater,
    DoForget,
    DoHandle,
    DoInTransaction,
    DoPhase,
    DoRelease,
    DoWait,
    Effect,
    HandlerBody,
    OverflowNotStored,
    new_do_handle,
)
from .handler import LateFinish

logger = logging.getLogger("idempotence.flows")

R = TypeVar("R")


# As a module global: a member read off its enum class goes through the metaclass's
# attribute lookup, about five times a global's cost.
_EXECUTE = Outcome.EXECUTE


class _Rollback(Exception):
    """Raised in a store transaction to make it roll back."""


async def drive_async(
    engine: Generator[Effect, Any, R], store: AsyncKeyStore, observer: Observer | None = None
) -> R:
    """Run ``engine`` to its result on ``store``, telling ``observer`` of each boundary
    it crosses. ``engine`` is a flow's run (a
    [`FlowResult`][idempotence.testing.harness.FlowResult]) or an entry point's
    generator of the engine's effects (a consumer's delivery)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = engine.send(value) if error is None else engine.throw(error)
        except StopIteration as done:
            result: R = done.value
            return result
        value, error = None, None
        try:
            value = await perform_async(effect, store, observer)
        except BaseException as exc:  # the engine decides, even on cancellation
            error = exc


def perform_async(
    effect: Effect, store: AsyncKeyStore, observer: Observer | None
) -> Awaitable[Any]:
    """Perform one effect of the engine on ``store``, for its result.

    An effect that is one call of the store is that call itself, with no coroutine
    of the driver's around it (async): a guarded request's claim and finish pass
    here, and a coroutine is a share of what the guard adds to each."""
    if isinstance(effect, DoClaim):
        return store.claim(effect.request)
    if isinstance(effect, DoFinish):
        return store.finish(effect.lease, effect.response, error=effect.error)
    if isinstance(effect, DoRelease):
        return store.release(effect.lease)
    if isinstance(effect, DoForget):
        return store.forget(effect.lease)
    if isinstance(effect, DoInTransaction) and isinstance(effect.fn, HandlerBody):
        # A request-as-transaction's one effect, performed by its own function with no
        # other around it (async: one coroutine, not two). A SQL store (the entry point
        # checked), not cast(): that is a call.
        return _handle_in_transaction_async(effect, effect.fn, store)  # type: ignore[arg-type]
    return _perform_async(effect, store, observer)


async def _perform_async(effect: Effect, store: AsyncKeyStore, observer: Observer | None) -> Any:
    """`perform_async` of the effects that are more than one call of the store."""
    if isinstance(effect, DoHandle):
        # The beat's arguments, not a partial or a closure: most handlers never beat.
        beating = AsyncPeriodic(
            "idempotence-heartbeat", effect.beat_every, _beat_async, store, effect.lease
        ).start()
        try:
            if effect.on_overflow is None:
                return await effect.app.run_app(effect, None, None)
            failed: list[OverflowNotStored] = []
            overflow = _overflow_async(effect, store, beating, failed)
            try:
                captured = await effect.app.run_app(effect, None, overflow)
            except Exception:
                unsent(failed)  # else the app's own exception
                raise
            unsent(failed)  # the app caught it and answered something: not sent
            return captured
        finally:
            # The block's end in line (not async with): a coroutine only for a beat
            # in flight, which nearly no handler has.
            if beating.halt():
                await beating.stop()
    if isinstance(effect, DoFinishLater):
        later = effect
        name = f"idempotence-finish-{later.finish.lease.key}"
        return spawn_async(lambda: _finish_later_async(later, store), name)
    if isinstance(effect, DoWait):
        request = effect.request
        # A store that cannot hold the duplicate (no WAITING) is polled: a pause, then
        # the engine's next claim.
        if effect.poll or Capability.WAITING not in capabilities_of(store):
            return await sleep_async(effect.seconds)
        return await store.wait_for_settle(request.scope, request.key, effect.seconds)
    # The rest shares the store's transaction with the application: a SQL store.
    sql = cast(AsyncStore, store)
    if isinstance(effect, DoPhase):
        return await _phase_async(effect, sql, observer)
    if isinstance(effect, DoCall):
        return await _call_async(effect, sql, observer)
    if isinstance(effect, DoInTransaction):  # a phase's (a handler's is perform_async's)
        return await _in_transaction_async(effect, sql, observer)
    if isinstance(effect, DoCheckpoint):
        async with sql.transaction() as tx:
            return await sql.checkpoint(
                tx, effect.lease, effect.recovery_point, calling=effect.calling
            )
    raise AssertionError(f"unknown effect {effect!r}")


async def _beat_async(store: AsyncKeyStore, lease: Lease) -> bool:
    """One beat of a running handler (F2): whether to go on beating. Refused, the key
    was taken over (the handler stalled past its lock timeout): the settle will be
    refused too, so the beats stop. A failure never fails the request: the next beat
    tries again, and two can fail before the lock lapses."""
    try:
        await store.heartbeat(lease)
    except LockLost as exc:
        logger.warning("stopped beating for a handler whose key was taken over: %s", exc)
        return False
    except StoreError as exc:
        logger.warning("heartbeat failed, trying again at the next: %s", exc)
    except Exception as exc:
        logger.error("heartbeat failed, trying again at the next: %s", exc, exc_info=exc)
    return True


async def _finish_later_async(effect: DoFinishLater, store: AsyncKeyStore) -> None:
    """Try ``effect``'s finish again until it lands, is refused, or the lock lapses
    ([`LateFinish`][idempotence.flows.handler.LateFinish] says when), beating when a
    beat is due so that the key stays locked meanwhile."""
    finish, lease = effect.finish, effect.finish.lease
    schedule = LateFinish(effect.lock_timeout, effect.beat_every)
    tries = 0
    while (pause := schedule.pause()) is not None:
        await sleep_async(pause)
        tries += 1
        try:
            await store.finish(lease, finish.response, error=finish.error)
        except LockLost as exc:
            # The first try landed after all (its outcome was unknown), or a retry
            # took the key over: either way the key holds its answer.
            logger.info("stopped storing the answer of key %r: %s", lease.key, exc)
            return
        except StoreError as exc:
            logger.debug("storing the answer of key %r failed again: %s", lease.key, exc)
        else:
            logger.info("stored the answer of key %r after %d tries", lease.key, tries)
            return
        if schedule.beat_due():
            sent_at = time.monotonic()
            try:
                await store.heartbeat(lease)
            except LockLost as exc:
                logger.info("stopped storing the answer of key %r: %s", lease.key, exc)
                return
            except StoreError:
                continue
            schedule.beaten(sent_at)
    logger.error(
        "gave up storing the answer of key %r after %d tries: its lock lapses, and a "
        "retry runs the request again",
        lease.key,
        tries,
    )


def _overflow_async(
    effect: DoHandle, store: AsyncKeyStore, beating: AsyncPeriodic, failed: list[OverflowNotStored]
) -> Callable[[int], Awaitable[None]]:
    """Settle the key of a response too large to store, just before it streams out
    (the heartbeat stopped first: the key is no longer held). A failed release or
    forget is logged, and the key's lock expires so that a retry can take it over
    (P5). A failed finish raises `OverflowNotStored`, also kept in ``failed``: the
    response must not go out, since a retry could not be told what became of it."""

    async def overflow(status: int) -> None:
        assert effect.on_overflow is not None
        await beating.stop()
        settle = effect.on_overflow(status)
        try:
            await perform_async(settle, store, None)
        except IdempotenceError as exc:
            if isinstance(settle, DoFinish):
                failed.append(OverflowNotStored(settle, exc))
                raise failed[0] from exc
            logger.error("could not settle a key whose response was too large: %s", exc)

    return overflow


async def _phase_async(effect: DoPhase, store: AsyncStore, observer: Observer | None) -> Any:
    ctx = effect.context
    with watch(store.instrumentation, effect) as watching:
        async with store.transaction() as tx:
            ctx.tx = tx
            returned = effect.fn(ctx, ctx.result) if effect.with_result else effect.fn(ctx)
            result = await settle_async(returned, NOT_SYNC.format("a phase"))
            ending = closing(result, ctx)
            if observer is not None:
                observer(effect.event("before_commit"))
            lease = await store.end_phase(tx, ctx.lease, jobs=ctx.jobs, **ending)
        watching.done(result)
    if observer is not None:
        observer(effect.event("after_commit"))
    return result, lease


async def _call_async(effect: DoCall, store: AsyncStore, observer: Observer | None) -> Any:
    lease = effect.lease
    foreign = ForeignContext(
        effect.flow, effect.record, lease, heartbeat=lambda: store.heartbeat(lease)
    )
    with watch(store.instrumentation, effect):
        if observer is not None:
            observer(effect.event("before"))
        value = await settle_async(effect.step.call(foreign), NOT_SYNC.format("a foreign call"))
        after_call(observer, effect)
    return value


async def _handle_in_transaction_async(
    effect: DoInTransaction, body: HandlerBody, store: AsyncStore
) -> Any:
    """F3 with the application handler as the phase's body: the claim opens the
    transaction (sent with its BEGIN), the handler writes in it, and its response is
    finished at the COMMIT (sent with it), or everything rolls back. A fixed response
    is written by the claim itself. The handler's exception is returned, once rolled
    back; a store failure is raised."""
    outcome: Any = None
    rolling_back = False
    fixed = body.step.fixed_response
    try:
        async with store.transaction(claim=effect.request, finished=fixed) as tx:
            claim = tx.claim
            assert claim is not None
            if claim.outcome is not _EXECUTE:
                return claim, None
            lease = claim.lease
            assert lease is not None
            try:
                outcome = await body.app.run_app(
                    new_do_handle(body.app, lease, body.step.limit, None, None), tx, None
                )
            except Exception as exc:
                outcome = exc
            response = None if isinstance(outcome, Exception) else body.keep(outcome)
            if response is None:
                rolling_back = True
                raise _Rollback()
            if fixed is None:
                await store.finish(lease, response, tx=tx, at_commit=True)
    except _Rollback:
        pass
    except Exception as exc:
        if not rolling_back:
            raise  # the claim, the finish or the commit failed
        # The rollback failed (the connection broke): the transaction is gone anyway.
        logger.warning("rollback failed: %s", exc)
    return claim, outcome


async def _in_transaction_async(
    effect: DoInTransaction, store: AsyncStore, observer: Observer | None
) -> Any:
    with watch(store.instrumentation, effect) as watching:
        async with store.transaction(claim=effect.request) as tx:
            claim = tx.claim
            assert claim is not None
            if claim.outcome is not _EXECUTE:
                return claim, None
            assert claim.lease is not None
            ctx = PhaseContext(effect.flow, claim.record, claim.lease, tx)
            assert not isinstance(effect.fn, HandlerBody)
            result = await settle_async(effect.fn(ctx), NOT_SYNC.format("a phase"))
            require_finish(result)
            if observer is not None:
                observer(effect.event("before_commit"))
            await store.end_phase(tx, claim.lease, jobs=ctx.jobs, **closing(result, ctx))
        watching.done(result)
    if observer is not None:
        observer(effect.event("after_commit"))
    return claim, result
