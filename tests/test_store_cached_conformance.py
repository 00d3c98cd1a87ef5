"""The store conformance suite (DESIGN 4, F1, F2, R2, F3) on CachedStore: Redis in
front of PostgreSQL and of SQLite, sync and async (DESIGN 8).

The tests are those of tests/test_store_conformance.py, collected here again with the
``store`` fixture opening a cached store over each primary: the shared Redis, a key
prefix of the test's own, deleted at the end (never FLUSHALL). Every replay in them
after a finish made through the store is served from Redis.
"""

from __future__ import annotations

from typing import Any

import pytest

from idempotence import AsyncSqliteStore, SqliteStore
from idempotence.stores.cached import AsyncCachedStore, CachedStore
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from tests.support.stores import StoreKind
from tests.test_store_conformance import *  # noqa: F403 - the same tests, collected here

#: The conftest's hook parametrizes ``store_kind`` with these, and no Redis store.
STORE_KINDS = ["postgres-sync", "postgres-async", "sqlite-sync", "sqlite-async"]


@pytest.fixture
def store_kind(request: pytest.FixtureRequest, redis_url: str, redis_prefix: str) -> StoreKind:
    """A cached store over each primary, in each flavour."""
    backend, flavour = request.param.split("-")
    target = request.getfixturevalue("pg_url" if backend == "postgres" else "sqlite_path")
    primary: Any = {
        ("postgres", "sync"): PostgresStore,
        ("postgres", "async"): AsyncPostgresStore,
        ("sqlite", "sync"): SqliteStore,
        ("sqlite", "async"): AsyncSqliteStore,
    }[backend, flavour]
    cached: Any = CachedStore if flavour == "sync" else AsyncCachedStore
    return StoreKind(
        backend, flavour, lambda: cached(primary(target), redis_url, prefix=redis_prefix)
    )
