"""Every store the library ships, behind one sync face, for the suites that run on
each store in both flavours (the face itself is :mod:`idempotence.testing._blocking`,
which the exported conformance suite uses too)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from idempotence import AsyncSqliteStore, AsyncStore, SqliteStore, Store
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from idempotence.stores.redis import AsyncRedisStore, RedisStore
from idempotence.testing._blocking import Blocking, BlockingTransaction, EventLoopThread

__all__ = ["STORES", "Blocking", "BlockingTransaction", "EventLoopThread", "StoreKind", "opener"]


@dataclass(frozen=True)
class StoreKind:
    """One store under test: its backend, its flavour, and how to open it."""

    backend: str  # "postgres" | "sqlite" | "redis"
    flavour: str  # "sync" | "async"
    open: Callable[[], Store | AsyncStore]

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.flavour}"


def _redis(cls: type[Any]) -> Callable[..., Any]:
    def open_redis(redis_url: str, redis_prefix: str) -> Any:
        return cls(redis_url, prefix=redis_prefix)

    return open_redis


#: Every store of the library in each flavour, by id: its class, and how a test opens
#: one (the opener's parameters are fixtures of tests/conftest.py, looked up by name:
#: a migrated database, or a Redis key prefix of the test's own). The conformance
#: suite runs on each (tests/test_store_conformance.py); the suites that need a SQL
#: store run on those with transactions (``store_kind`` in tests/conftest.py).
STORES: dict[str, tuple[type[Any], Callable[..., Any]]] = {
    "postgres-sync": (PostgresStore, lambda pg_url: PostgresStore(pg_url)),
    "postgres-async": (AsyncPostgresStore, lambda pg_url: AsyncPostgresStore(pg_url)),
    "sqlite-sync": (SqliteStore, lambda sqlite_path: SqliteStore(sqlite_path)),
    "sqlite-async": (AsyncSqliteStore, lambda sqlite_path: AsyncSqliteStore(sqlite_path)),
    "redis-sync": (RedisStore, _redis(RedisStore)),
    "redis-async": (AsyncRedisStore, _redis(AsyncRedisStore)),
}


def opener(kind: str, request: Any) -> Callable[[], Any]:
    """How to open store ``kind`` in the test of ``request`` (its fixtures resolved)."""
    _, open_store = STORES[kind]
    names = inspect.signature(open_store).parameters
    return functools.partial(open_store, **{n: request.getfixturevalue(n) for n in names})
