"""Key stores. Import the backend you use from its module, or from [`idempotence`][idempotence].

The PostgreSQL store needs the ``postgres`` extra (psycopg 3); the SQLite store needs
nothing beyond the standard library. [`KeyStore`][idempotence.stores.KeyStore] and
[`AsyncKeyStore`][idempotence.stores.AsyncKeyStore] are what every backend
honours; [`Store`][idempotence.stores.Store] and
[`AsyncStore`][idempotence.stores.AsyncStore], the SQL stores, add the
transaction shared with the application that flows and request-as-transaction need
(`_interface`). `cached` (the ``redis`` extra) puts a Redis cache of finished responses
in front of a SQL store, and stands in for it.

The layout shows the architecture. Each backend is a package: `postgres`, `sqlite`,
`redis`, `cached`, each its public face in ``__init__``, its store in
``_store_async.py`` (``_store.py`` generated from it) and what the two share in
``_store_shared.py``. Beside them, the shared machinery at two levels: what only the SQL
stores run on is the private package ``_sql`` (the operations, the store classes, the
connection runners, the retry policy, batching; no driver), and what every store shares,
SQL or key-value, is flat private modules here (the key-store protocols ``_interface``,
the refusal of a fenced write ``_fenced``, the wait for a twin ``_listener*`` and
``_waiters``, the Redis URL check). So a new SQL backend finds what it builds on in one
place, and the Redis store takes nothing from ``_sql`` but the dialect type the
PostgreSQL listener it shares is written for. A store built outside the package uses the
public interface only: `sql` and [`keyvalue`][idempotence.stores.keyvalue].
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
