"""The SQLite key store on the standard library, sync and async (the embedded default).

SQLite serialises writers, which makes the claim simple and exactly as safe as on
PostgreSQL on one node: it runs as read-decide-write inside ``BEGIN IMMEDIATE``, and
no other writer can interleave. The database is put in WAL mode so readers never
wait for the writer, and every connection waits (``busy_timeout``) rather than fail
at once when another holds the write lock.

Both stores are written in `_store` (sqlite3 has no async API: the async store
runs the same connections on threads); the dialect, error translation, connections and
group commit they share are in `_store_shared`.
"""

from ._store import AsyncSqliteStore, SqliteStore
from ._store_shared import (
    DEFAULT_BUSY_TIMEOUT,
    MAX_IDLE_CONNECTIONS,
    SYNCHRONOUS,
    SqliteConnection,
    SqliteDialect,
    connect,
    translate,
)

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "MAX_IDLE_CONNECTIONS",
    "SYNCHRONOUS",
    "AsyncSqliteStore",
    "SqliteConnection",
    "SqliteDialect",
    "SqliteStore",
    "connect",
    "translate",
]
