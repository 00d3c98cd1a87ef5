"""Every store behind one face for the ``@idempotent`` suites (DESIGN 12).

:class:`Subject` guards a plain (sync) test body on one store: a ``def`` on a sync
store, or, on an async store, an ``async def`` that runs the body in a thread (so a
body that blocks, waiting at a gate or sleeping, never blocks the event loop and its
heartbeats) and is called from the test's threads through the suite's event loop.
The body sees :func:`~idempotence.current_call` either way (``asyncio.to_thread``
copies the context).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from idempotence import AsyncSqliteStore, SqliteStore, idempotent
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from tests.support.stores import EventLoopThread

BACKENDS = ["sqlite", "postgres", "redis", "cached", "sqlalchemy"]
FLAVOURS = ["sync", "async"]
SQL_BACKENDS = {"sqlite", "postgres", "cached", "sqlalchemy"}


@dataclass
class Subject:
    """One store under test, and how to guard and call a body on it."""

    backend: str
    flavour: str
    store: Any
    loop: EventLoopThread
    closers: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.flavour}"

    @property
    def sql(self) -> bool:
        return self.backend in SQL_BACKENDS

    def guard(self, body: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        """``body`` guarded by ``@idempotent(store, **options)``, as a blocking call."""
        options.setdefault("name", f"{body.__qualname__}-{uuid.uuid4().hex[:8]}")
        if self.flavour == "sync":
            return idempotent(self.store, **options)(body)

        @functools.wraps(body)
        async def in_a_thread(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(body, *args, **kwargs)

        guarded = idempotent(self.store, **options)(in_a_thread)

        @functools.wraps(body)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.loop.run(guarded(*args, **kwargs))

        return call

    def sync(self, value: Any) -> Any:
        """A store operation's result: awaited on the loop for an async store."""
        if asyncio.iscoroutine(value):
            return self.loop.run(value)
        return value

    def execute(self, tx: Any, sql: str, params: Any = None) -> Any:
        """``tx.execute`` from a body (a thread): on the loop for an async transaction."""
        result = tx.execute(sql, params)
        if asyncio.iscoroutine(result):
            return asyncio.run_coroutine_threadsafe(result, self.loop.loop).result(timeout=30)
        return result

    def run_sql(self, sql: str, params: Any = None) -> Any:
        """``sql`` in a transaction of its own on the store's database."""
        store = self.store
        if self.flavour == "sync":
            with store.transaction() as tx:
                return tx.execute(sql, params)

        async def run() -> Any:
            async with store.transaction() as tx:
                return await tx.execute(sql, params)

        return self.loop.run(run())

    def get(self, scope: str, key: str) -> Any:
        return self.sync(self.store.get(scope, key))


def _open(
    urls: dict[str, str], backend: str, flavour: str, closers: list[Callable[[], Any]]
) -> Any:
    if backend == "sqlite":
        path = urls["sqlite"]
        return SqliteStore(path) if flavour == "sync" else AsyncSqliteStore(path)
    if backend in ("postgres", "cached"):
        primary: Any = (
            PostgresStore(urls["pg"]) if flavour == "sync" else AsyncPostgresStore(urls["pg"])
        )
        if backend == "postgres":
            return primary
        from idempotence.stores.cached import AsyncCachedStore, CachedStore

        cached: Any = CachedStore if flavour == "sync" else AsyncCachedStore
        return cached(primary, urls["redis"], prefix=f"{urls['prefix']}:cache")
    if backend == "redis":
        from idempotence.stores.redis import AsyncRedisStore, RedisStore

        kind: Any = RedisStore if flavour == "sync" else AsyncRedisStore
        return kind(urls["redis"], prefix=urls["prefix"])
    assert backend == "sqlalchemy"
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
    from sqlalchemy.orm import sessionmaker

    from idempotence.contrib.sqlalchemy import AsyncSQLAlchemyStore, SQLAlchemyStore

    url = urls["pg"].replace("postgresql://", "postgresql+psycopg://", 1)
    if flavour == "sync":
        engine = sa.create_engine(url)
        closers.append(engine.dispose)
        return SQLAlchemyStore(sessionmaker(engine))
    async_engine = create_async_engine(url)
    closers.append(async_engine.dispose)
    return AsyncSQLAlchemyStore(async_sessionmaker(async_engine))


def _subject(
    request: pytest.FixtureRequest, loop_thread: EventLoopThread, param: str
) -> Iterator[Subject]:
    backend, flavour = param.split("-")
    urls: dict[str, str] = {}
    if backend == "sqlite":
        urls["sqlite"] = request.getfixturevalue("sqlite_path")
    if backend in ("postgres", "cached", "sqlalchemy"):
        urls["pg"] = request.getfixturevalue("pg_url")
    if backend in ("redis", "cached"):
        urls["redis"] = request.getfixturevalue("redis_url")
        urls["prefix"] = request.getfixturevalue("redis_prefix")
    closers: list[Callable[[], Any]] = []
    if flavour == "async":
        # An async store is bound to the loop it is first used on: open it there.
        async def opened() -> Any:
            return _open(urls, backend, flavour, closers)

        store = loop_thread.run(opened())
    else:
        store = _open(urls, backend, flavour, closers)
    subject = Subject(backend, flavour, store, loop_thread, closers)
    try:
        yield subject
    finally:
        subject.sync(store.close())
        for close in closers:
            subject.sync(close())


@pytest.fixture(params=[f"{b}-{f}" for b in BACKENDS for f in FLAVOURS])
def subject(request: pytest.FixtureRequest, loop_thread: EventLoopThread) -> Iterator[Subject]:
    """Each store, each flavour."""
    yield from _subject(request, loop_thread, request.param)


@pytest.fixture(params=[f"{b}-{f}" for b in BACKENDS if b in SQL_BACKENDS for f in FLAVOURS])
def sql_subject(request: pytest.FixtureRequest, loop_thread: EventLoopThread) -> Iterator[Subject]:
    """Each store that shares its transaction with the function (F3), each flavour."""
    yield from _subject(request, loop_thread, request.param)
