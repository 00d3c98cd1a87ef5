"""Perform a flow engine's effects on a store: the sync and the async driver.

The engine (:meth:`idempotence.flows.Flow.engine`) decides; these two only do what it
asks and send back the result, or throw back the exception. They are the only flow
code that exists twice.
"""

from __future__ import annotations

import inspect
from typing import Any

from .errors import ConfigurationError
from .flows import (
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
    NoOp,
    PhaseContext,
)
from .states import Outcome
from .stores import AsyncStore, Store


def closing(result: Any) -> dict[str, Any]:
    """How a phase's result closes its transaction (``end_phase`` arguments)."""
    if isinstance(result, Advance):
        return {"recovery_point": result.recovery_point}
    if isinstance(result, Finish):
        return {"response": result.response}
    if isinstance(result, NoOp):
        return {}
    raise ConfigurationError(
        f"a phase must return Advance, Finish or NoOp, not {type(result).__name__}"
        + (" (a coroutine: run the flow with run_async)" if inspect.isawaitable(result) else "")
    )


def drive(engine: Engine, store: Store) -> FlowResult:
    """Run ``engine`` to its result on a sync store."""
    value: Any = None
    error: Exception | None = None
    while True:
        try:
            effect = engine.send(value) if error is None else engine.throw(error)
        except StopIteration as done:
            result: FlowResult = done.value
            return result
        value, error = None, None
        try:
            value = _perform(effect, store)
        except Exception as exc:
            error = exc


def _perform(effect: Effect, store: Store) -> Any:
    if isinstance(effect, DoClaim):
        return store.claim(effect.request)
    if isinstance(effect, DoPhase):
        ctx = effect.context
        with store.transaction() as tx:
            ctx.tx = tx
            result = effect.fn(ctx, ctx.result) if effect.with_result else effect.fn(ctx)
            lease = store.end_phase(tx, ctx.lease, jobs=ctx.jobs, **closing(result))
        return result, lease
    if isinstance(effect, DoCall):
        lease = effect.lease
        foreign = ForeignContext(
            effect.flow, effect.record, lease, heartbeat=lambda: store.heartbeat(lease)
        )
        value = effect.step.call(foreign)
        if inspect.isawaitable(value):
            raise ConfigurationError("a foreign call returned a coroutine: use run_async")
        return value
    if isinstance(effect, DoInTransaction):
        with store.transaction() as tx:
            claim = store.claim(effect.request, tx=tx)
            if claim.outcome is not Outcome.EXECUTE:
                return claim, None
            assert claim.lease is not None
            ctx = PhaseContext(effect.flow, claim.record, claim.lease, tx)
            result = effect.fn(ctx)
            _require_finish(result)
            store.end_phase(tx, claim.lease, jobs=ctx.jobs, **closing(result))
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


async def drive_async(engine: Engine, store: AsyncStore) -> FlowResult:
    """Run ``engine`` to its result on an async store."""
    value: Any = None
    error: Exception | None = None
    while True:
        try:
            effect = engine.send(value) if error is None else engine.throw(error)
        except StopIteration as done:
            result: FlowResult = done.value
            return result
        value, error = None, None
        try:
            value = await _perform_async(effect, store)
        except Exception as exc:
            error = exc


async def _settle(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _perform_async(effect: Effect, store: AsyncStore) -> Any:
    if isinstance(effect, DoClaim):
        return await store.claim(effect.request)
    if isinstance(effect, DoPhase):
        ctx = effect.context
        async with store.transaction() as tx:
            ctx.tx = tx
            result = await _settle(
                effect.fn(ctx, ctx.result) if effect.with_result else effect.fn(ctx)
            )
            lease = await store.end_phase(tx, ctx.lease, jobs=ctx.jobs, **closing(result))
        return result, lease
    if isinstance(effect, DoCall):
        lease = effect.lease
        foreign = ForeignContext(
            effect.flow, effect.record, lease, heartbeat=lambda: store.heartbeat(lease)
        )
        return await _settle(effect.step.call(foreign))
    if isinstance(effect, DoInTransaction):
        async with store.transaction() as tx:
            claim = await store.claim(effect.request, tx=tx)
            if claim.outcome is not Outcome.EXECUTE:
                return claim, None
            assert claim.lease is not None
            ctx = PhaseContext(effect.flow, claim.record, claim.lease, tx)
            result = await _settle(effect.fn(ctx))
            _require_finish(result)
            await store.end_phase(tx, claim.lease, jobs=ctx.jobs, **closing(result))
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


def _require_finish(result: Any) -> None:
    if not isinstance(result, Finish):
        raise ConfigurationError(
            "the phase of a request-as-transaction flow must return Finish (F3)"
        )
