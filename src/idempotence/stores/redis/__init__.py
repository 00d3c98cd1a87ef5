"""The Redis key store on redis-py, sync and async (DESIGN 8: the fast variant).

Needs the ``redis`` extra (``pip install 'idempotence[redis]'``). A
[`KeyStore`][idempotence.stores.redis.KeyStore]: plain handler endpoints and consumers,
not flows or request-as-transaction, which share a SQL transaction with the application.
Every operation is one Lua script (``redis.lua``); a Redis Cluster is served by hash
tags (``redis+cluster://host:port``, or a ``RedisCluster`` client). Read
[`AsyncRedisStore`][idempotence.stores.redis.AsyncRedisStore] for what it guarantees and
what it cannot.

[`AsyncRedisStore`][idempotence.stores.redis.AsyncRedisStore] is written in
`_store_async`; [`RedisStore`][idempotence.stores.redis.RedisStore] is generated from it
(``scripts/unasync.py``).
"""

# A package's __init__ runs before any of its modules: the one place to name the
# extra when the driver is missing, whichever module is imported first.
try:
    import redis  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise ImportError("the Redis store needs redis-py: pip install 'idempotence[redis]'") from exc

from typing import TYPE_CHECKING

from ._store import RedisStore
from ._store_async import AsyncRedisStore
from ._store_shared import DEFAULT_PREFIX, DEFAULT_TIMEOUT, record_key

__all__ = ["DEFAULT_PREFIX", "DEFAULT_TIMEOUT", "AsyncRedisStore", "RedisStore", "record_key"]

if TYPE_CHECKING:
    from .._interface import AsyncKeyStore, KeyStore

    # mypy proves here that the Redis stores honour the key-store interface.
    def _conforms(sync: RedisStore, async_: AsyncRedisStore) -> tuple[KeyStore, AsyncKeyStore]:
        return sync, async_
