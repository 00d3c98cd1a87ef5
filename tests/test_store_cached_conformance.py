"""The store conformance suite (DESIGN 4, F1, F2, R2, F3) on CachedStore: Redis in
front of PostgreSQL and of SQLite, sync and async (DESIGN 8).

The cache is on the shared Redis under a key prefix of the test's own, deleted at the
end (never FLUSHALL). Every replay in the suite after a finish made through the store
is served from Redis. The locks are the primary's rows, aged there. The store has
its primary's capabilities: in front of PostgreSQL it listens, and the suite is told.
"""

from __future__ import annotations

import pytest

from idempotence import AsyncSqliteStore, SqliteStore
from idempotence.stores.cached import AsyncCachedStore, CachedStore
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from idempotence.testing.conformance import suite
from tests.support.clock import age_key, age_lock

# The fast tier runs one pass (the sync store over SQLite); the others are slow.
TestCachedPostgres = pytest.mark.slow(
    suite(
        CachedStore,
        lambda pg_url, redis_url, redis_prefix: CachedStore(
            PostgresStore(pg_url), redis_url, prefix=redis_prefix
        ),
        age_lock=age_lock,
        age_key=age_key,
        capabilities=PostgresStore.capabilities,  # its primary's: it listens
    )
)
TestAsyncCachedPostgres = pytest.mark.slow(
    suite(
        AsyncCachedStore,
        lambda pg_url, redis_url, redis_prefix: AsyncCachedStore(
            AsyncPostgresStore(pg_url), redis_url, prefix=redis_prefix
        ),
        age_lock=age_lock,
        age_key=age_key,
        capabilities=AsyncPostgresStore.capabilities,
    )
)
TestCachedSqlite = suite(
    CachedStore,
    lambda sqlite_path, redis_url, redis_prefix: CachedStore(
        SqliteStore(sqlite_path), redis_url, prefix=redis_prefix
    ),
    age_lock=age_lock,
    age_key=age_key,
)
TestAsyncCachedSqlite = pytest.mark.slow(
    suite(
        AsyncCachedStore,
        lambda sqlite_path, redis_url, redis_prefix: AsyncCachedStore(
            AsyncSqliteStore(sqlite_path), redis_url, prefix=redis_prefix
        ),
        age_lock=age_lock,
        age_key=age_key,
    )
)
