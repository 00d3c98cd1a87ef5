"""A SQL key store with a Redis cache of finished responses in front (DESIGN 8).

Needs the ``redis`` extra (``pip install 'idempotence[redis]'``). The primary store
(PostgreSQL or SQLite) stays the source of truth; Redis serves replays, so the common
retry costs one Redis GET and no round trip to the database. A stale or missing entry
costs a read of the primary, never a wrong answer; Redis down costs nothing but speed.
See [`AsyncCachedStore`][idempotence.stores.cached.AsyncCachedStore] (the source;
[`CachedStore`][idempotence.stores.cached.CachedStore] is generated from it, F7) and the
guide "Keep keys in Redis, or cache replays in Redis" (docs/how-to/redis.md).
"""

from ._store import CachedStore
from ._store_async import AsyncCachedStore
from ._store_shared import (
    DEFAULT_CLOCK_SKEW,
    DEFAULT_PAUSE,
    DEFAULT_TIMEOUT,
    DEFAULT_TTL,
    CacheStats,
)

__all__ = [
    "DEFAULT_CLOCK_SKEW",
    "DEFAULT_PAUSE",
    "DEFAULT_TIMEOUT",
    "DEFAULT_TTL",
    "AsyncCachedStore",
    "CacheStats",
    "CachedStore",
]
