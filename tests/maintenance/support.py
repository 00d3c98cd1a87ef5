"""Helpers for the maintenance suites: a database of the test's own on each backend,
raw SQL beside the store (to age rows, to count), and keys in every state."""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from idempotence import AsyncStore, ClaimRequest, Store, StoredResponse
from idempotence import maintenance as m
from idempotence.states import Claim, Lease
from tests.support.clock import Rows
from tests.support.sql_dialects import SQL
from tests.support.stores import EventLoopThread

LIVE = timedelta(hours=1)
EXPIRED = timedelta(milliseconds=1)


@dataclass
class Backend:
    """One migrated database that only this test uses, and stores on it.

    Maintenance scans every scope, so unlike the conformance suites these tests cannot
    share a database split by scope.
    """

    kind: str  # a SQL backend's name: "postgres", "sqlite", "mariadb" (sql_dialects.py)
    #: The URL the CLI takes.
    url: str
    opener: Callable[[], Store]
    async_opener: Callable[[], AsyncStore]
    _stores: list[Store] = field(default_factory=list)
    _store: Store | None = None
    _async_stores: list[AsyncStore] = field(default_factory=list)
    _loop: EventLoopThread | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = self.open()
        return self._store

    def open(self) -> Store:
        """Another store on the same database: a second node."""
        store = self.opener()
        self._stores.append(store)
        return store

    @property
    def loop(self) -> EventLoopThread:
        """The event loop the async stores and services of this test run on."""
        if self._loop is None:
            self._loop = EventLoopThread()
        return self._loop

    def open_async(self) -> AsyncStore:
        """An async store on the same database (closed with the backend)."""
        store = self.async_opener()
        self._async_stores.append(store)
        return store

    def close(self) -> None:
        for store in self._stores:
            store.close()
        if self._loop is not None:
            for async_store in self._async_stores:
                self._loop.run(async_store.close())
            self._loop.close()

    # -- raw SQL, written with %(name)s parameters for both ---------------------------

    @property
    def rows(self) -> Rows:
        return Rows(self.kind, self.url)

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self.rows.execute(sql, params)

    def sql(self, sql: str) -> str:
        """``sql`` in the store's own parameter style (for ``tx.execute``)."""
        return sql if self.kind != "sqlite" else re.sub(r"%\((\w+)\)s", r":\1", sql)

    def backdate(self, scope: str, key: str | None, age: timedelta, *columns: str) -> None:
        """Move the ``columns`` of one key (every key of ``scope`` if None) ``age``
        into the past (tests/support/clock.py)."""
        self.rows.backdate(scope, key, age, *columns)

    @property
    def key_column(self) -> str:
        """The key table's ``key`` column as a statement names it (KEY is reserved
        in MariaDB)."""
        return SQL[self.kind].key

    def row(self, scope: str, key: str) -> dict[str, Any] | None:
        rows = self.execute(
            "SELECT * FROM idempotency_keys"
            f" WHERE scope = %(scope)s AND {self.key_column} = %(key)s",
            {"scope": scope, "key": key},
        )
        return rows[0] if rows else None

    def count(self, table: str, where: str = "TRUE") -> int:
        where = where if self.kind == "postgres" else where.replace("TRUE", "1")
        return int(self.execute(f"SELECT count(*) AS n FROM {table} WHERE {where}")[0]["n"])


class AsyncTwin:
    """An async service behind its sync twin's face (``run_once``, ``run_forever``
    with a :class:`threading.Event`), run on the backend's event loop thread, so one
    test body checks that both flavours do the same (F7)."""

    def __init__(self, service: Any, loop: EventLoopThread) -> None:
        self.service = service
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self.service, name)

    def run_once(self, stop: threading.Event | None = None, **kw: Any) -> Any:
        assert stop is None, "pass no stop to an async twin's run_once"
        return self._loop.run(self.service.run_once(**kw))

    def run_forever(self, stop: threading.Event) -> None:
        async def forever() -> None:
            stopping = asyncio.Event()

            async def watch() -> None:
                # The test's stop is a threading.Event: poll it.
                while not stop.is_set():  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                stopping.set()

            watcher = asyncio.create_task(watch())
            try:
                await self.service.run_forever(stopping)
            finally:
                watcher.cancel()

        self._loop.run(forever())


@dataclass
class Flavour:
    """Makes a background service in one flavour: ``sync`` on :attr:`Backend.store`,
    or ``async``: the ``Async`` twin of the class, on an async store of the same
    database, behind :class:`AsyncTwin`."""

    name: str  # "sync" | "async"
    db: Backend
    _async_store: AsyncStore | None = None

    def __call__(self, cls: type[Any], *args: Any, node: bool = False, **kw: Any) -> Any:
        """``cls(store, *args, **kw)`` in this flavour; ``node``: on a store of its
        own (another node)."""
        if self.name == "sync":
            return cls(self.db.open() if node else self.db.store, *args, **kw)
        twin = getattr(m, "Async" + cls.__name__)
        if node:
            store = self.db.open_async()
        else:
            if self._async_store is None:
                self._async_store = self.db.open_async()
            store = self._async_store
        return AsyncTwin(twin(store, *args, **kw), self.db.loop)


def new_scope() -> str:
    return f"m-{uuid.uuid4().hex[:10]}"


def claim(
    store: Store,
    scope: str,
    key: str,
    *,
    lock_timeout: timedelta = LIVE,
    retention: timedelta | None = timedelta(hours=24),
    flow: str = "default",
    params: Any = None,
) -> Claim:
    claimed = store.claim(
        ClaimRequest(
            scope=scope,
            key=key,
            fingerprint="f" * 64,
            flow=flow,
            params=params if params is not None else {},
            lock_timeout=lock_timeout,
            retention=retention,
        )
    )
    assert claimed.lease is not None, claimed
    return claimed


def finished(
    store: Store,
    scope: str,
    key: str,
    *,
    status: int = 200,
    error: str | None = None,
    retention: timedelta | None = timedelta(hours=24),
) -> Lease:
    lease = claim(store, scope, key, retention=retention).lease
    assert lease is not None
    store.finish(lease, StoredResponse.of(status, body="{}"), error=error)
    return lease


def pending(store: Store, scope: str, key: str, **kw: Any) -> Lease:
    lease = claim(store, scope, key, **kw).lease
    assert lease is not None
    store.release(lease)
    return lease


def in_threads(*targets: Callable[[], Any]) -> list[Any]:
    """Run ``targets`` at once (released together by a barrier); return their results,
    re-raising the first error."""
    barrier = threading.Barrier(len(targets))
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []

    def run(i: int, target: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[i] = target()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        raise errors[0]
    return results
