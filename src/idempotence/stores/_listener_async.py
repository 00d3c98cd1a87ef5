"""P10 on PostgreSQL: the listener that wakes a duplicate waiting for its twin (see
`_listener_shared` for how a wait goes)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import psycopg

from .._concurrency import AsyncBackground, AsyncWakeup, sleep_async
from ..errors import StoreError
from ._listener_shared import APPLICATION_NAME, STOP_CHECK, ListenerBase, logger
from ._sql.ops import Dialect
from ._waiters import Waiters, notifiable


class AsyncListener(ListenerBase):
    """A store's listener: one connection of its own, read by a background job."""

    def __init__(
        self, dialect: Dialect, conninfo: str, kwargs: Mapping[str, Any], connect_timeout: float
    ) -> None:
        super().__init__(dialect, conninfo, kwargs, connect_timeout)
        self.waiters: Waiters[AsyncWakeup] = Waiters(AsyncWakeup.set)
        self._reader = AsyncBackground(APPLICATION_NAME)

    async def wait(
        self, scope: str, key: str, seconds: float, mark: Callable[[], Awaitable[bool]]
    ) -> None:
        """Wait up to ``seconds`` for the key to settle; ``mark`` runs the
        ``mark_waiter`` operation on the store."""
        deadline = time.monotonic() + seconds
        if not notifiable(scope, key):
            await sleep_async(seconds)
            return
        woken = AsyncWakeup()
        self.waiters.add(scope, key, woken)
        try:
            if await self._reader.ensure(self._read_async):
                try:
                    if not await mark():
                        return  # settled since the claim: claim again now
                except StoreError as exc:
                    # The next claim meets the same failure and answers for it.
                    logger.debug("could not mark a waiter, polling instead: %s", exc)
            await woken.wait(max(deadline - time.monotonic(), 0.0))
        finally:
            self.waiters.discard(scope, key, woken)

    async def _read_async(self, ready: Callable[[bool], None]) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, **self._options)
            await conn.execute(self._listen)
            self._connected()
            ready(True)
            while not self._reader.stopping:
                async for notify in conn.notifies(timeout=STOP_CHECK):
                    self.waiters.notify(notify.payload)
        except psycopg.Error as exc:
            self._failed(exc)
        finally:
            ready(False)  # if it never came up
            if conn is not None:
                await conn.close()

    async def close(self) -> None:
        self._closed = True
        await self._reader.stop(STOP_CHECK + 1.0)
