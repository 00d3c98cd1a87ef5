"""Perform the lifecycle's effects on a store: the sync and the async driver.

:func:`drive` (WSGI, Django) and :func:`drive_async` (ASGI) run a
:func:`~._core.lifecycle` to its :class:`~._core.Reply`. The store's effects are
performed here; reading the body and running the app are the server-specific part,
delegated to an ``io`` object. These two functions are the only lifecycle code that
exists twice.

A plain handler runs on any :class:`~idempotence.KeyStore`; a transaction or a flow
narrows it to the SQL store (:func:`_sql`), which :class:`~._config.Idempotency`
already demanded for such an endpoint.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol

from ..errors import ConfigurationError, IdempotenceError
from ..stores import AsyncKeyStore, AsyncStore, AsyncTransaction, KeyStore, Store, Transaction
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


class _Rollback(Exception):
    """Thrown into a store transaction to make it roll back."""


class SyncIO(Protocol):
    def read_body(self, limit: int) -> bytes:
        """The whole body; raise BodyTooLarge past ``limit`` bytes."""

    def run_app(self, run: RunApp, overflow: Callable[[int], None]) -> Captured:
        """Run the app, buffering its response (see :class:`~._core.RunApp`)."""


class AsyncIO(Protocol):
    async def read_body(self, limit: int) -> bytes: ...

    async def run_app(
        self, run: RunApp, overflow: Callable[[int], Awaitable[None]]
    ) -> Captured: ...


def _sql(store: KeyStore) -> Store:
    """``store`` as the SQL store that a transaction or a flow needs."""
    if not isinstance(store, Store):
        raise ConfigurationError(_NOT_SQL.format(type(store).__name__))
    return store


def _sql_async(store: AsyncKeyStore) -> AsyncStore:
    if not isinstance(store, AsyncStore):
        raise ConfigurationError(_NOT_SQL.format(type(store).__name__))
    return store


_NOT_SQL = (
    "{} serves plain handler endpoints only: request-as-transaction and flows share "
    "the store's transaction with the application and need a SQL store"
)


def drive(engine: Lifecycle, store: KeyStore, io: SyncIO) -> Reply:
    """Run ``engine`` on a sync store; an exception of the app's propagates."""
    tx_cm: AbstractContextManager[Transaction] | None = None
    tx: Transaction | None = None
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
                    opening = _sql(store).transaction(claim=effect.claim)
                    tx = opening.__enter__()
                    tx_cm = opening
                    value = tx.claim
                elif isinstance(effect, EndTransaction):
                    closing, tx_cm, tx = tx_cm, None, None  # closed whatever happens next
                    assert closing is not None, "EndTransaction without a transaction"
                    _end(closing, effect.commit)
                elif isinstance(effect, RunApp):
                    with bound(tx if effect.in_transaction else None, effect.lease):
                        value = io.run_app(effect, _overflow(effect, store))
                else:
                    value = _perform(effect, store, tx, io)
            except Exception as exc:
                error = exc
    finally:
        if tx_cm is not None:  # the lifecycle ended or died with it open
            _end(tx_cm, commit=False)


def _perform(effect: Effect, store: KeyStore, tx: Transaction | None, io: SyncIO) -> Any:
    if isinstance(effect, ResolveScope):
        tenant = effect.fn(effect.request)
        if inspect.isawaitable(tenant):
            close = getattr(tenant, "close", None)
            if close is not None:
                close()
            raise ConfigurationError("the scope callable of a WSGI app must not be async")
        return tenant
    if isinstance(effect, ReadBody):
        return io.read_body(effect.limit)
    if isinstance(effect, ClaimKey):
        return store.claim(effect.request)
    if isinstance(effect, FinishKey | ReleaseKey | ForgetKey):
        return _store_op(effect, store, tx)
    if isinstance(effect, WaitForTwin):
        store.wait_for_settle(effect.request.scope, effect.request.key, effect.seconds)
        return None
    if isinstance(effect, RunFlow):
        return effect.flow.run(_sql(store), effect.request)
    raise AssertionError(f"unexpected effect {effect!r}")


def _store_op(effect: StoreEffect, store: KeyStore, tx: Transaction | None) -> None:
    if isinstance(effect, FinishKey):
        if effect.at_commit:
            assert tx is not None, "FinishKey(at_commit=True) without a transaction"
            sql = _sql(store)
            sql.finish(effect.lease, effect.response, tx=tx, error=effect.error, at_commit=True)
        else:
            store.finish(effect.lease, effect.response, error=effect.error)
    elif isinstance(effect, ReleaseKey):
        store.release(effect.lease)
    else:
        store.forget(effect.lease)


def _end(cm: AbstractContextManager[Any], commit: bool) -> None:
    if commit:
        cm.__exit__(None, None, None)
        return
    try:
        cm.__exit__(_Rollback, _Rollback(), None)
    except Exception as exc:  # the connection broke: the transaction is gone anyway
        logger.warning("rollback failed: %s", exc)


def _overflow(run: RunApp, store: KeyStore) -> Callable[[int], None]:
    """Settle the key of a response too large to store, just before it streams out.
    The response is on its way regardless: a store failure is logged, and the key's
    lock expires so that a retry can take it over (P5)."""

    def overflow(status: int) -> None:
        assert run.on_overflow is not None
        try:
            _store_op(run.on_overflow(status), store, None)
        except IdempotenceError as exc:
            logger.error("could not settle a key whose response was too large: %s", exc)

    return overflow


async def drive_async(engine: Lifecycle, store: AsyncKeyStore, io: AsyncIO) -> Reply:
    """The async twin of :func:`drive`."""
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
                    opening_async = _sql_async(store).transaction(claim=effect.claim)
                    tx = await opening_async.__aenter__()
                    tx_cm = opening_async
                    value = tx.claim
                elif isinstance(effect, EndTransaction):
                    closing, tx_cm, tx = tx_cm, None, None
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
        if tx_cm is not None:
            await _end_async(tx_cm, commit=False)


async def _perform_async(
    effect: Effect, store: AsyncKeyStore, tx: AsyncTransaction | None, io: AsyncIO
) -> Any:
    if isinstance(effect, ResolveScope):
        tenant = effect.fn(effect.request)
        return await tenant if inspect.isawaitable(tenant) else tenant
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
            sql_async = _sql_async(store)
            await sql_async.finish(
                effect.lease, effect.response, tx=tx, error=effect.error, at_commit=True
            )
        else:
            await store.finish(effect.lease, effect.response, error=effect.error)
    elif isinstance(effect, ReleaseKey):
        await store.release(effect.lease)
    else:
        await store.forget(effect.lease)


def _overflow_async(run: RunApp, store: AsyncKeyStore) -> Callable[[int], Awaitable[None]]:
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
    except Exception as exc:
        logger.warning("rollback failed: %s", exc)
