"""Perform the lifecycle's effects on a store.

:func:`drive_async` (ASGI) runs a :func:`~._core.lifecycle` to its
:class:`~._effects.Reply`; :func:`drive` (WSGI, Django) is generated from it. The
store's effects are performed here; reading the body and running the app are the
server-specific part, delegated to an ``io`` object.

A plain handler runs on any :class:`~idempotence.KeyStore`; a transaction or a flow
narrows it to the SQL store (:func:`_sql_async`), which
:class:`~._config.Idempotency` already demanded for such an endpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from .._awaitables import settle_async
from ..errors import ConfigurationError, IdempotenceError
from ..stores import AsyncKeyStore, AsyncStore, AsyncTransaction
from ._context import bound
from ._effects import (
    BeginTransaction,
    Captured,
    ClaimKey,
    Effect,
    EndTransaction,
    FinishKey,
    ForgetKey,
    Lifecycle,
    ReadBody,
    ReleaseKey,
    Reply,
    ResolveScope,
    RunApp,
    RunFlow,
    StoreEffect,
    WaitForTwin,
)

logger = logging.getLogger("idempotence.http")

_NOT_SQL = (
    "{} serves plain handler endpoints only: request-as-transaction and flows share "
    "the store's transaction with the application and need a SQL store"
)
_SYNC_SCOPE = "the scope callable of a WSGI app must not be async"


class _Rollback(Exception):
    """Thrown into a store transaction to make it roll back."""


class AsyncIO(Protocol):
    """What the server integration does for the driver."""

    async def read_body(self, limit: int) -> bytes:
        """The whole body; raise BodyTooLarge past ``limit`` bytes."""

    async def run_app(self, run: RunApp, overflow: Callable[[int], Awaitable[None]]) -> Captured:
        """Run the app, buffering its response (see :class:`~._effects.RunApp`)."""


def _sql_async(store: AsyncKeyStore) -> AsyncStore:
    """``store`` as the SQL store that a transaction or a flow needs."""
    if not isinstance(store, AsyncStore):
        raise ConfigurationError(_NOT_SQL.format(type(store).__name__))
    return store


async def drive_async(engine: Lifecycle, store: AsyncKeyStore, io: AsyncIO) -> Reply:
    """Run ``engine`` on ``store``; an exception of the app's propagates."""
    tx_cm: AbstractAsyncContextManager[AsyncTransaction] | None = None
    tx: AsyncTransaction | None = None
    value: Any = None
    error: Exception | None = None
    try:
        while True:
            try:
                effect = engine.send(value) if error is None else engine.throw(error)
            except StopIteration as done:
                reply: Reply = done.value
                return reply
            value, error = None, None
            try:
                if isinstance(effect, BeginTransaction):
                    opening = _sql_async(store).transaction(claim=effect.claim)
                    tx = await opening.__aenter__()
                    tx_cm = opening
                    value = tx.claim
                elif isinstance(effect, EndTransaction):
                    closing, tx_cm, tx = tx_cm, None, None  # closed whatever happens next
                    assert closing is not None, "EndTransaction without a transaction"
                    await _end_async(closing, effect.commit)
                elif isinstance(effect, RunApp):
                    with bound(tx if effect.in_transaction else None, effect.lease):
                        value = await io.run_app(effect, _overflow_async(effect, store))
                else:
                    value = await _perform_async(effect, store, tx, io)
            except Exception as exc:
                error = exc
    finally:
        if tx_cm is not None:  # the lifecycle ended or died with it open
            await _end_async(tx_cm, commit=False)


async def _perform_async(
    effect: Effect, store: AsyncKeyStore, tx: AsyncTransaction | None, io: AsyncIO
) -> Any:
    if isinstance(effect, ResolveScope):
        return await settle_async(effect.fn(effect.request), _SYNC_SCOPE)
    if isinstance(effect, ReadBody):
        return await io.read_body(effect.limit)
    if isinstance(effect, ClaimKey):
        return await store.claim(effect.request)
    if isinstance(effect, FinishKey | ReleaseKey | ForgetKey):
        return await _store_op_async(effect, store, tx)
    if isinstance(effect, WaitForTwin):
        await store.wait_for_settle(effect.request.scope, effect.request.key, effect.seconds)
        return None
    if isinstance(effect, RunFlow):
        return await effect.flow.run_async(_sql_async(store), effect.request)
    raise AssertionError(f"unexpected effect {effect!r}")


async def _store_op_async(
    effect: StoreEffect, store: AsyncKeyStore, tx: AsyncTransaction | None
) -> None:
    if isinstance(effect, FinishKey):
        if effect.at_commit:
            assert tx is not None, "FinishKey(at_commit=True) without a transaction"
            await _sql_async(store).finish(
                effect.lease, effect.response, tx=tx, error=effect.error, at_commit=True
            )
        else:
            await store.finish(effect.lease, effect.response, error=effect.error)
    elif isinstance(effect, ReleaseKey):
        await store.release(effect.lease)
    else:
        await store.forget(effect.lease)


def _overflow_async(run: RunApp, store: AsyncKeyStore) -> Callable[[int], Awaitable[None]]:
    """Settle the key of a response too large to store, just before it streams out.
    The response is on its way regardless: a store failure is logged, and the key's
    lock expires so that a retry can take it over (P5)."""

    async def overflow(status: int) -> None:
        assert run.on_overflow is not None
        try:
            await _store_op_async(run.on_overflow(status), store, None)
        except IdempotenceError as exc:
            logger.error("could not settle a key whose response was too large: %s", exc)

    return overflow


async def _end_async(cm: AbstractAsyncContextManager[Any], commit: bool) -> None:
    if commit:
        await cm.__aexit__(None, None, None)
        return
    try:
        await cm.__aexit__(_Rollback, _Rollback(), None)
    except Exception as exc:  # the connection broke: the transaction is gone anyway
        logger.warning("rollback failed: %s", exc)
