"""Key stores. Import the backend you use from its module, or from :mod:`idempotence`.

The PostgreSQL store needs the ``postgres`` extra (psycopg 3); the SQLite store needs
nothing beyond the standard library.
"""

from ._driver import TransientError
from ._store import AsyncStore, AsyncTransaction, Store, Transaction

__all__ = ["AsyncStore", "AsyncTransaction", "Store", "Transaction", "TransientError"]
