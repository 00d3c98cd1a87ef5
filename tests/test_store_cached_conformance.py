"""The store conformance suite (DESIGN 4, F1, F2, R2, F3) on CachedStore: Redis in
front of PostgreSQL and of SQLite, sync and async (DESIGN 8).

The cache is on the shared Redis under a key prefix of the test's own, deleted at the
end (never FLUSHALL). Every replay in the suite after a finish made through the store
is served from Redis. The locks are the primary's rows, aged there. The store has
its primary's capabilities: in front of PostgreSQL it listens, and the suite is told.
"""

from __future__ import annotations

from typing import Any

import pytest

from idempotence.stores.cached import AsyncCachedStore, CachedStore
from idempotence.testing.conformance import suite
from tests.support.clock import age_key, age_lock
from tests.support.stores import STORES, opener


def cached(store_type: type[Any], primary: str) -> type[Any]:
    """The suite on ``store_type`` in front of the primary store ``primary`` (an id of
    tests/support/stores.py's ``STORES``, opened on its fixtures), with the primary's
    capabilities (in front of PostgreSQL, it listens)."""

    def open_store(request: pytest.FixtureRequest, redis_url: str, redis_prefix: str) -> Any:
        return store_type(opener(primary, request)(), redis_url, prefix=redis_prefix)

    primary_type, _ = STORES[primary]
    return suite(
        store_type,
        open_store,
        age_lock=age_lock,
        age_key=age_key,
        capabilities=primary_type.capabilities,
    )


# The fast tier runs one pass (the sync store over SQLite); the others are slow.
TestCachedPostgres = pytest.mark.slow(cached(CachedStore, "postgres-sync"))
TestAsyncCachedPostgres = pytest.mark.slow(cached(AsyncCachedStore, "postgres-async"))
TestCachedSqlite = cached(CachedStore, "sqlite-sync")
TestAsyncCachedSqlite = pytest.mark.slow(cached(AsyncCachedStore, "sqlite-async"))
