"""The Redis key store on redis-py, sync and async (DESIGN 8: the fast variant).

Needs the ``redis`` extra (``pip install 'idempotence[redis]'``). A
:class:`~idempotence.KeyStore`: plain handler endpoints and consumers, not flows or
request-as-transaction, which share a SQL transaction with the application. Every
operation is one Lua script (``redis.lua``); a Redis Cluster is served by hash tags
(``redis+cluster://host:port``, or a ``RedisCluster`` client). Read
:class:`AsyncRedisStore` for what it guarantees and what it cannot.

:class:`AsyncRedisStore` is written in :mod:`._redis_async`; :class:`RedisStore` is
generated from it (``scripts/unasync.py``).
"""

from typing import TYPE_CHECKING

from ._redis import RedisStore
from ._redis_async import AsyncRedisStore
from ._redis_base import DEFAULT_PREFIX, DEFAULT_TIMEOUT, record_key

__all__ = ["DEFAULT_PREFIX", "DEFAULT_TIMEOUT", "AsyncRedisStore", "RedisStore", "record_key"]

if TYPE_CHECKING:
    from ._interface import AsyncKeyStore, KeyStore

    # mypy proves here that the Redis stores honour the key-store interface.
    def _conforms(sync: RedisStore, async_: AsyncRedisStore) -> tuple[KeyStore, AsyncKeyStore]:
        return sync, async_
