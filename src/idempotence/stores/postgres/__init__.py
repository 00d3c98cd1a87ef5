"""The PostgreSQL key store on psycopg 3, sync and async (DESIGN 8: the reference).

The claim is one ``INSERT ... ON CONFLICT`` statement in autocommit: one round trip
(see ``sql/postgres/queries.sql``). The store works with a pool it opens from a
conninfo, with the application's own ``psycopg_pool`` pool, or with one connection
the application already has (then its operations share that connection's
transactions, which is what request-as-transaction mode wants).

[`AsyncPostgresStore`][idempotence.stores.postgres.AsyncPostgresStore] is written in
`_store_async`; [`PostgresStore`][idempotence.stores.postgres.PostgresStore] is
generated from it (``scripts/unasync.py``). For a store built on the SQL store interface
([`idempotence.stores.sql`][idempotence.stores.sql]) over a psycopg connection of its
own (the Django store is one), the dialect, the error translation and the connection are
public too: `PostgresDialect`, `translate`, `PostgresConnection` and `BoundedClaim` (a
claim whose lock wait is bounded, F8).
"""

# A package's __init__ runs before any of its modules: the one place to name the
# extra when the driver is missing, whichever module is imported first.
try:
    import psycopg  # noqa: F401
    import psycopg_pool  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the PostgreSQL store needs psycopg 3: pip install 'idempotence[postgres]'"
    ) from exc

from ._store import BoundedClaim, PostgresConnection, PostgresStore
from ._store_async import AsyncBoundedClaim, AsyncPostgresConnection, AsyncPostgresStore
from ._store_shared import DEFAULT_CONNECT_TIMEOUT, PostgresDialect, bounded_claim, translate

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "AsyncBoundedClaim",
    "AsyncPostgresConnection",
    "AsyncPostgresStore",
    "BoundedClaim",
    "PostgresConnection",
    "PostgresDialect",
    "PostgresStore",
    "bounded_claim",
    "translate",
]
