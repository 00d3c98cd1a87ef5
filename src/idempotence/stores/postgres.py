"""The PostgreSQL key store on psycopg 3, sync and async (DESIGN 8: the reference).

The claim is one ``INSERT ... ON CONFLICT`` statement in autocommit: one round trip
(see ``sql/postgres/queries.sql``). The store works with a pool it opens from a
conninfo, with the application's own ``psycopg_pool`` pool, or with one connection
the application already has (then its operations share that connection's
transactions, which is what request-as-transaction mode wants).

:class:`AsyncPostgresStore` is written in :mod:`._postgres_async`;
:class:`PostgresStore` is generated from it (``scripts/unasync.py``).
"""

from ._postgres import PostgresStore
from ._postgres_async import AsyncPostgresStore
from ._postgres_base import DEFAULT_CONNECT_TIMEOUT, PostgresDialect, translate

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "AsyncPostgresStore",
    "PostgresDialect",
    "PostgresStore",
    "translate",
]
