"""Perform a flow engine's effects on a store.

The engine (:meth:`~.flow.Flow.engine`) decides; the driver only does what
it asks and sends back the result, or throws back the exception. Each phase and
foreign call is wrapped in the store's instrumentation (:func:`~._flow_steps.watch`).
"""

from __future__ import annotations

from typing import Any

from .._awaitables import settle_async
from ..states import Outcome
from ..stores import AsyncStore
from ._steps import NOT_SYNC, after_call, closing, require_finish, watch
from .contexts import ForeignContext, Observer, PhaseContext
from .effects import (
    DoCall,
    DoCheckpoint,
    DoClaim,
    DoFinish,
    DoForget,
    DoInTransaction,
    DoPhase,
    DoRelease,
    Effect,
    Engine,
)
from .results import FlowResult


async def drive_async(
    engine: Engine, store: AsyncStore, observer: Observer | None = None
) -> FlowResult:
    """Run ``engine`` to its result on ``store``, telling ``observer`` of each
    boundary it crosses."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = engine.send(value) if error is None else engine.throw(error)
        except StopIteration as done:
            result: FlowResult = done.value
            return result
        value, error = None, None
        try:
            value = await _perform_async(effect, store, observer)
        except BaseException as exc:  # the engine decides, even on cancellation
            error = exc


async def _perform_async(effect: Effect, store: AsyncStore, observer: Observer | None) -> Any:
    if isinstance(effect, DoClaim):
        return await store.claim(effect.request)
    if isinstance(effect, DoPhase):
        return await _phase_async(effect, store, observer)
    if isinstance(effect, DoCall):
        return await _call_async(effect, store, observer)
    if isinstance(effect, DoInTransaction):
        return await _in_transaction_async(effect, store, observer)
    if isinstance(effect, DoCheckpoint):
        async with store.transaction() as tx:
            return await store.checkpoint(tx, effect.lease, effect.recovery_point)
    if isinstance(effect, DoFinish):
        return await store.finish(effect.lease, effect.response, error=effect.error)
    if isinstance(effect, DoRelease):
        return await store.release(effect.lease)
    if isinstance(effect, DoForget):
        return await store.forget(effect.lease)
    raise AssertionError(f"unknown effect {effect!r}")


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


async def _in_transaction_async(
    effect: DoInTransaction, store: AsyncStore, observer: Observer | None
) -> Any:
    with watch(store.instrumentation, effect) as watching:
        async with store.transaction(claim=effect.request) as tx:
            claim = tx.claim
            assert claim is not None
            if claim.outcome is not Outcome.EXECUTE:
                return claim, None
            assert claim.lease is not None
            ctx = PhaseContext(effect.flow, claim.record, claim.lease, tx)
            result = await settle_async(effect.fn(ctx), NOT_SYNC.format("a phase"))
            require_finish(result)
            if observer is not None:
                observer(effect.event("before_commit"))
            await store.end_phase(tx, claim.lease, jobs=ctx.jobs, **closing(result, ctx))
        watching.done(result)
    if observer is not None:
        observer(effect.event("after_commit"))
    return claim, result
