"""Key stores. Import the backend you use from its module, or from [`idempotence`][idempotence].

The PostgreSQL store needs the ``postgres`` extra (psycopg 3); the SQLite store needs
nothing beyond the standard library. [`KeyStore`][idempotence.stores.redis.KeyStore] and
[`AsyncKeyStore`][idempotence.stores.redis.AsyncKeyStore] are what every backend
honours; [`Store`][idempotence.testing.harness.Store] and
[`AsyncStore`][idempotence.testing.harness.AsyncStore], the SQL stores, add the
transaction shared with the application that flows and request-as-transaction need
(`_interface`). `cached` (the ``redis`` extra) puts a Redis cache of finished responses
in front of a SQL store, and stands in for it.
"""

from typing import TYPE_CHECKING

from ..errors import TransientError
from ._interface import AsyncKeyStore, KeyStore
from ._sql.placeholders import to_pyformat
from ._sql.store import Store, Transaction
from ._sql.store_async import AsyncStore, AsyncTransaction

__all__ = [
    "AsyncKeyStore",
    "AsyncStore",
    "AsyncTransaction",
    "KeyStore",
    "Store",
    "Transaction",
    "TransientError",
    "to_pyformat",
]

if TYPE_CHECKING:
    # mypy proves here that the SQL stores honour the key-store interface.
    def _conforms(sync: Store, async_: AsyncStore) -> tuple[KeyStore, AsyncKeyStore]:
        return sync, async_
