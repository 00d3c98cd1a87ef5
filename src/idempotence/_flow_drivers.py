"""Perform a flow engine's effects on a store: the sync and the async driver.

The engine (:meth:`idempotence.flows.Flow.engine`) decides; these two only do what it
asks and send back the result, or throw back the exception. They are the only flow
code that exists twice. Both wrap each phase and foreign call in the store's
instrumentation (:func:`_watch`), which is synchronous code either way.
"""

from __future__ import annotations

import inspect
from typing import Any

from .errors import ConfigurationError
from .flows import (
    ATTEMPT_MARK,
    Advance,
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
    Finish,
    FlowResult,
    ForeignContext,
    Indeterminate,
    NoOp,
    Observer,
    PhaseContext,
)
from .observability import NO_WATCH, Instrumentation, Watch
from .states import FINISHED, STARTED, Outcome
from .stores import AsyncStore, Store


def closing(result: Any, ctx: PhaseContext) -> dict[str, Any]:
    """How a phase's result closes its transaction (``end_phase`` arguments).

    An advance to a recovery point without a step is refused before it commits: the
    key would be stranded there (and ``finished`` without a response is no finish).
    """
    flow = ctx.flow
    if isinstance(result, Advance):
        point = result.recovery_point
        if point not in flow.steps:
            hint = "; end the flow with Finish(response)" if point == FINISHED else ""
            raise ConfigurationError(
                f"a phase of flow {flow.name!r} advanced to {point!r}, where it has no step{hint}"
            )
        return {"recovery_point": point}
    if isinstance(result, Finish):
        return {"response": result.response}
    if isinstance(result, NoOp):
        # Stay at the step's own point. After a non-idempotent call that returned, the
        # attempt mark must go: the call's outcome is known and recorded, and a mark
        # left behind would make the next attempt take the key for crashed mid-call.
        return {"recovery_point": ctx.lease.recovery_point.partition(ATTEMPT_MARK)[0]}
    hint = ""
    if inspect.isawaitable(result):
        _discard(result)
        hint = " (a coroutine: run the flow with run_async)"
    raise ConfigurationError(
        f"a phase must return Advance, Finish or NoOp, not {type(result).__name__}{hint}"
    )


def drive(engine: Engine, store: Store, observer: Observer | None = None) -> FlowResult:
    """Run ``engine`` to its result on a sync store, telling ``observer`` of each
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
            value = _perform(effect, store, observer)
        except BaseException as exc:  # the engine decides, even on cancellation
            error = exc


def _perform(effect: Effect, store: Store, observer: Observer | None) -> Any:
    if isinstance(effect, DoClaim):
        return store.claim(effect.request)
    if isinstance(effect, DoPhase):
        ctx = effect.context
        with _watch(store.instrumentation, effect) as watch:
            with store.transaction() as tx:
                ctx.tx = tx
                result = effect.fn(ctx, ctx.result) if effect.with_result else effect.fn(ctx)
                ending = closing(result, ctx)
                if observer is not None:
                    observer(effect.event("before_commit"))
                lease = store.end_phase(tx, ctx.lease, jobs=ctx.jobs, **ending)
            watch.done(result)
        if observer is not None:
            observer(effect.event("after_commit"))
        return result, lease
    if isinstance(effect, DoCall):
        lease = effect.lease
        foreign = ForeignContext(
            effect.flow, effect.record, lease, heartbeat=lambda: store.heartbeat(lease)
        )
        with _watch(store.instrumentation, effect):
            if observer is not None:
                observer(effect.event("before"))
            value = effect.step.call(foreign)
            if inspect.isawaitable(value):
                _discard(value)
                raise ConfigurationError("a foreign call returned a coroutine: use run_async")
            _after_call(observer, effect)
        return value
    if isinstance(effect, DoInTransaction):
        with _watch(store.instrumentation, effect) as watch:
            with store.transaction(claim=effect.request) as tx:
                claim = tx.claim
                assert claim is not None
                if claim.outcome is not Outcome.EXECUTE:
                    return claim, None
                assert claim.lease is not None
                ctx = PhaseContext(effect.flow, claim.record, claim.lease, tx)
                result = effect.fn(ctx)
                _require_finish(result)
                if observer is not None:
                    observer(effect.event("before_commit"))
                store.end_phase(tx, claim.lease, jobs=ctx.jobs, **closing(result, ctx))
            watch.done(result)
        if observer is not None:
            observer(effect.event("after_commit"))
        return claim, result
    if isinstance(effect, DoCheckpoint):
        with store.transaction() as tx:
            return store.checkpoint(tx, effect.lease, effect.recovery_point)
    if isinstance(effect, DoFinish):
        return store.finish(effect.lease, effect.response, error=effect.error)
    if isinstance(effect, DoRelease):
        return store.release(effect.lease)
    if isinstance(effect, DoForget):
        return store.forget(effect.lease)
    raise AssertionError(f"unknown effect {effect!r}")


async def drive_async(
    engine: Engine, store: AsyncStore, observer: Observer | None = None
) -> FlowResult:
    """Run ``engine`` to its result on an async store (``observer`` as for :func:`drive`)."""
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


async def _settle(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _perform_async(effect: Effect, store: AsyncStore, observer: Observer | None) -> Any:
    if isinstance(effect, DoClaim):
        return await store.claim(effect.request)
    if isinstance(effect, DoPhase):
        ctx = effect.context
        with _watch(store.instrumentation, effect) as watch:
            async with store.transaction() as tx:
                ctx.tx = tx
                result = await _settle(
                    effect.fn(ctx, ctx.result) if effect.with_result else effect.fn(ctx)
                )
                ending = closing(result, ctx)
                if observer is not None:
                    observer(effect.event("before_commit"))
                lease = await store.end_phase(tx, ctx.lease, jobs=ctx.jobs, **ending)
            watch.done(result)
        if observer is not None:
            observer(effect.event("after_commit"))
        return result, lease
    if isinstance(effect, DoCall):
        lease = effect.lease
        foreign = ForeignContext(
            effect.flow, effect.record, lease, heartbeat=lambda: store.heartbeat(lease)
        )
        with _watch(store.instrumentation, effect):
            if observer is not None:
                observer(effect.event("before"))
            value = await _settle(effect.step.call(foreign))
            _after_call(observer, effect)
        return value
    if isinstance(effect, DoInTransaction):
        with _watch(store.instrumentation, effect) as watch:
            async with store.transaction(claim=effect.request) as tx:
                claim = tx.claim
                assert claim is not None
                if claim.outcome is not Outcome.EXECUTE:
                    return claim, None
                assert claim.lease is not None
                ctx = PhaseContext(effect.flow, claim.record, claim.lease, tx)
                result = await _settle(effect.fn(ctx))
                _require_finish(result)
                if observer is not None:
                    observer(effect.event("before_commit"))
                await store.end_phase(tx, claim.lease, jobs=ctx.jobs, **closing(result, ctx))
            watch.done(result)
        if observer is not None:
            observer(effect.event("after_commit"))
        return claim, result
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


def _watch(
    instrumentation: Instrumentation | None, effect: DoPhase | DoCall | DoInTransaction
) -> Watch[Any]:
    """The store's instrumentation around a phase or a foreign call (nothing without
    one). A phase is named by its step's recovery point, as the observer names it."""
    if instrumentation is None:
        return NO_WATCH
    if isinstance(effect, DoCall):
        lease = effect.lease
        return instrumentation.call(
            effect.flow.name,
            effect.step.name,
            derived_key=effect.flow.key_for(lease.id, effect.step.name),
            idempotent=effect.step.idempotent,
        )
    if isinstance(effect, DoInTransaction):
        return instrumentation.phase(effect.flow.name, STARTED)
    point = effect.context.lease.recovery_point.partition(ATTEMPT_MARK)[0]
    return instrumentation.phase(effect.context.flow.name, point)


def _after_call(observer: Observer | None, effect: DoCall) -> None:
    """Tell ``observer`` that the call returned. Should it raise (a harness aborting
    the run right there), the call did take effect: say so with an indeterminate
    failure, never a plain one, which would let a non-idempotent call run again."""
    if observer is None:
        return
    try:
        observer(effect.event("after"))
    except Exception as exc:
        raise Indeterminate(
            f"the run was aborted after the call {effect.step.name!r} returned"
        ) from exc


def _discard(awaitable: Any) -> None:
    # A coroutine handed to the sync driver is never awaited: close it, so Python
    # does not also warn "coroutine was never awaited" far from the cause.
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()


def _require_finish(result: Any) -> None:
    if not isinstance(result, Finish):
        raise ConfigurationError(
            "the phase of a request-as-transaction flow must return Finish (F3)"
        )
