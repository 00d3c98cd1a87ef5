"""P10 on PostgreSQL: a duplicate waiting for its twin is woken by LISTEN/NOTIFY.

Each store has at most one listener: a connection of its own (never one of the pool's:
a LISTENing connection stays open and idle for as long as the store lives), opened at
the first wait, that LISTENs on the channel of ``mark_waiter`` (see
``sql/postgres/queries.sql``) and hands every notification to the store's
:class:`~._waiters.Waiters`. The sync store reads it on a daemon thread, the async one
on a task of the event loop that first waited.

A wait (:meth:`Listener.wait`, :meth:`AsyncListener.wait`) goes:

1. register the waiter and make sure the LISTEN is active (connecting if need be);
2. mark the key as waited for. Only now: a settle that commits after the mark sends a
   NOTIFY that the listener is already subscribed to. No row marked means the key
   settled since the claim, so the wait ends at once and the caller claims again;
3. wait for the notification, at most ``seconds``; forget the waiter.

The caller's bounded pause is the upper bound of every wait, so correctness never
depends on a notification arriving: one only ends a wait early. If the listener cannot
connect, or its connection dies, waits just sleep (a warning is logged) and the next
wait connects again. A waiter whose scope is too long for a NOTIFY payload sleeps too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..errors import StoreError
from ._ops import Dialect, Op
from ._waiters import Waiters, notifiable

logger = logging.getLogger("idempotence.stores")

#: How the listener's connection shows in ``pg_stat_activity``, unless the
#: application named its connections itself.
APPLICATION_NAME = "idempotence-listener"

#: The sync listener looks up from the socket this often to notice that the store is
#: closing (a thread blocked on a socket cannot be interrupted).
_STOP_CHECK = 0.2


def mark_waiter(d: Dialect, scope: str, key: str) -> Op[bool]:
    """Ask to be notified when the key settles; False when it already has (P10)."""
    rows = yield d.query("mark_waiter", scope=scope, key=key)
    return bool(rows)


class _Listener:
    """What the sync and the async listener share: where to connect, and the log."""

    def __init__(
        self, dialect: Dialect, conninfo: str, kwargs: Mapping[str, Any], connect_timeout: float
    ) -> None:
        self._conninfo = conninfo
        options = dict(kwargs)
        options.update(autocommit=True, connect_timeout=max(int(connect_timeout), 1))
        if "application_name" not in options and "application_name" not in _parsed(conninfo):
            options["application_name"] = APPLICATION_NAME
        self._options = options
        self._listen = dialect.queries["listen"]
        self._closed = False
        self._healthy = True

    def _failed(self, exc: BaseException) -> None:
        if self._closed:
            return  # closing the store ends the connection: not a failure
        # One warning per outage, not one per waiting request.
        level = logging.WARNING if self._healthy else logging.DEBUG
        self._healthy = False
        logger.log(
            level,
            "the PostgreSQL listener connection failed (%s): duplicates waiting for their "
            "twin poll until the next wait reconnects it (P10)",
            exc,
        )

    def _connected(self) -> None:
        if not self._healthy:
            logger.info("the PostgreSQL listener connection is back (P10)")
        self._healthy = True


def _parsed(conninfo: str) -> dict[str, Any]:
    try:
        return conninfo_to_dict(conninfo)
    except psycopg.Error:
        return {}  # the connect itself will say what is wrong with it


class Listener(_Listener):
    """The sync store's listener: a daemon thread reading the connection."""

    def __init__(
        self, dialect: Dialect, conninfo: str, kwargs: Mapping[str, Any], connect_timeout: float
    ) -> None:
        super().__init__(dialect, conninfo, kwargs, connect_timeout)
        self.waiters: Waiters[threading.Event] = Waiters(threading.Event.set)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready: Future[bool] = Future()

    def wait(self, scope: str, key: str, seconds: float, mark: Callable[[], bool]) -> None:
        """Wait up to ``seconds`` for the key to settle; ``mark`` runs the
        ``mark_waiter`` operation on the store (see the module docstring)."""
        deadline = time.monotonic() + seconds
        if not notifiable(scope, key):
            time.sleep(seconds)
            return
        woken = threading.Event()
        self.waiters.add(scope, key, woken)
        try:
            if self._listening():
                try:
                    if not mark():
                        return  # settled since the claim: claim again now
                except StoreError as exc:
                    # The next claim meets the same failure and answers for it.
                    logger.debug("could not mark a waiter, polling instead: %s", exc)
            woken.wait(max(deadline - time.monotonic(), 0.0))
        finally:
            self.waiters.discard(scope, key, woken)

    def _listening(self) -> bool:
        """True once the LISTEN is active; starts (or restarts) the listener."""
        with self._lock:
            if self._closed:
                return False
            if self._thread is None or not self._thread.is_alive():
                self._ready = Future()
                self._thread = threading.Thread(
                    target=self._run, args=(self._ready,), name=APPLICATION_NAME, daemon=True
                )
                self._thread.start()
            ready = self._ready
        return ready.result()

    def _run(self, ready: Future[bool]) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = psycopg.connect(self._conninfo, **self._options)
            conn.execute(self._listen)
            self._connected()
            ready.set_result(True)
            while not self._stop.is_set():
                for notify in conn.notifies(timeout=_STOP_CHECK):
                    self.waiters.notify(notify.payload)
        except psycopg.Error as exc:
            self._failed(exc)
        finally:
            if not ready.done():
                ready.set_result(False)
            if conn is not None:
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread = self._thread
        self._stop.set()
        if thread is not None:
            thread.join(_STOP_CHECK + 1.0)


class AsyncListener(_Listener):
    """The async store's listener: a task reading the connection, on the event loop
    of the first wait (and of a later one, if that loop went away)."""

    def __init__(
        self, dialect: Dialect, conninfo: str, kwargs: Mapping[str, Any], connect_timeout: float
    ) -> None:
        super().__init__(dialect, conninfo, kwargs, connect_timeout)
        self.waiters: Waiters[asyncio.Future[None]] = Waiters(_wake)
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[bool] | None = None

    async def wait(
        self, scope: str, key: str, seconds: float, mark: Callable[[], Awaitable[bool]]
    ) -> None:
        """The awaitable twin of :meth:`Listener.wait`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        if not notifiable(scope, key):
            await asyncio.sleep(seconds)
            return
        woken: asyncio.Future[None] = loop.create_future()
        self.waiters.add(scope, key, woken)
        try:
            if await self._listening():
                try:
                    if not await mark():
                        return
                except StoreError as exc:
                    logger.debug("could not mark a waiter, polling instead: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken, max(deadline - loop.time(), 0.0))
        finally:
            self.waiters.discard(scope, key, woken)

    async def _listening(self) -> bool:
        if self._closed:
            return False
        loop = asyncio.get_running_loop()
        task = self._task
        if task is None or task.done() or task.get_loop() is not loop:
            if task is not None and not task.done():
                _cancel(task)  # it reads on a loop other than this one
            self._ready = ready = loop.create_future()
            self._task = loop.create_task(self._run(ready), name=APPLICATION_NAME)
        assert self._ready is not None
        # Shielded: a waiter given up on must not cancel the connect others wait for.
        return await asyncio.shield(self._ready)

    async def _run(self, ready: asyncio.Future[bool]) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, **self._options)
            await conn.execute(self._listen)
            self._connected()
            ready.set_result(True)
            async for notify in conn.notifies():
                self.waiters.notify(notify.payload)
        except psycopg.Error as exc:
            self._failed(exc)
        finally:
            if not ready.done():
                ready.set_result(False)
            if conn is not None:
                await conn.close()

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is None or task.done():
            return
        if task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            await asyncio.wait([task])
        else:
            _cancel(task)


def _wake(waiter: asyncio.Future[None]) -> None:
    # The listener may run on another loop (or thread) than the waiter.
    with contextlib.suppress(RuntimeError):  # the waiter's loop is closed: nobody waits
        waiter.get_loop().call_soon_threadsafe(_resolve, waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _cancel(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(RuntimeError):  # its loop is closed: the task is gone
        task.get_loop().call_soon_threadsafe(task.cancel)
