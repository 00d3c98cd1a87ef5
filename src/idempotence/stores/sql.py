"""The SQL store interface: what a database supplies to become a key store.

Every SQL store (PostgreSQL, SQLite, the SQLAlchemy and Django stores) runs the same
operations, written once as generators of named queries; a database supplies only
what differs. This module names exactly what a store built outside
``idempotence/stores/`` may use; everything else under ``idempotence.stores`` whose
name starts with an underscore may change without notice.

What a SQL dialect supplies:

* **Its queries file**: ``queries.sql``, every statement the store runs, each under a
  ``-- name --`` header, with ``schema.sql`` and ``migrations/NNNN_*.sql`` beside it;
  ``:name`` placeholders throughout. A built-in dialect's are in
  ``idempotence/sql/<name>/``; a dialect outside the package names its own folder
  (``Dialect.sql_folder``).
* **A** [`Dialect`][idempotence.stores.sql.Dialect] **subclass**: its ``name`` (the
  folder above), whether its claim is one atomic statement (``claim_is_one_statement``;
  the claim is then
  [`claim_in_one_statement`][idempotence.stores.sql.claim_in_one_statement], else
  [`claim_in_transaction`][idempotence.stores.sql.claim_in_transaction] under a write
  lock), its value conversions (``timestamp``, ``duration_in``, ``duration_out``) and
  the placeholders of the application's own statements (``application``; see
  [`to_pyformat`][idempotence.stores.sql.to_pyformat] for a driver that takes
  ``%(name)s``), and for a connection that sends its own ``BEGIN`` and ``COMMIT``,
  the statements of a transaction and of a savepoint
  ([`transaction_statements`][idempotence.stores.sql.Dialect.transaction_statements]).
* **A connection and a source**: a [`Connection`][idempotence.stores.sql.Connection] (or
  [`AsyncConnection`][idempotence.stores.sql.AsyncConnection]) runs one
  [`Query`][idempotence.stores.sql.Query] on the driver's connection and opens
  transactions; a [`Source`][idempotence.stores.sql.Source] (or
  [`AsyncSource`][idempotence.stores.sql.AsyncSource]) hands connections out;
  [`SingleSource`][idempotence.stores.sql.SingleSource] (or
  [`AsyncSingleSource`][idempotence.stores.sql.AsyncSingleSource]) is the source of
  one connection the application owns.
  [`run`][idempotence.stores.sql.run] and [`body`][idempotence.stores.sql.body] (and
  their ``_async`` twins) do the rest; [`Blocks`][idempotence.stores.sql.Blocks] keeps
  the operations deferred to a commit. A connection whose statements commit themselves
  outside a transaction subclasses
  [`AutocommitConnection`][idempotence.stores.sql.AutocommitConnection] (or
  [`AsyncAutocommitConnection`][idempotence.stores.sql.AsyncAutocommitConnection]) and
  writes only ``fetch``, ``atomic`` and ``defer``.
* **Error translation**: a function from the driver's exception to the library's
  ([`StoreUnavailable`][idempotence.errors.StoreUnavailable] when the database cannot be
  reached, [`TransientError`][idempotence.stores.TransientError] when the statement may
  simply run again, [`SchemaMissing`][idempotence.errors.SchemaMissing], else
  [`StoreError`][idempotence.errors.StoreError]), wrapped by
  [`translator`][idempotence.stores.sql.translator].
  [`KeyHeld`][idempotence.stores.sql.KeyHeld] is what a claim whose lock wait ran out
  raises.
* **The store classes**: a subclass of [`Store`][idempotence.stores.Store] (or
  [`AsyncStore`][idempotence.stores.AsyncStore]) that builds its dialect and
  source; the operations are inherited.

What it can and cannot do is said by the dialect's class attributes and by the
queries it defines: a database without ``LISTEN`` waits for a twin by polling, and
one without a batched statement (``claim_batch``) claims one key per statement.

Example:
    ```python
    from importlib.resources import files

    from idempotence.stores.sql import Dialect, claim_in_transaction

    class MyDialect(Dialect):
        name = "mydb"
        sql_folder = files("mypackage") / "sql"   # queries.sql, schema.sql, migrations/
        claim_is_one_statement = False  # claims under a write lock

        def claim(self, request, finished=None):
            return claim_in_transaction(self, request, finished)
        ...
    ```
"""

from __future__ import annotations

from ._sql.connection import (
    AutocommitConnection,
    Connection,
    Fetcher,
    SingleSource,
    Source,
    body,
    run,
)
from ._sql.connection_async import (
    AsyncAutocommitConnection,
    AsyncConnection,
    AsyncFetcher,
    AsyncSingleSource,
    AsyncSource,
    body_async,
    run_async,
)
from ._sql.ops import (
    APPLICATION,
    Dialect,
    Op,
    Query,
    Row,
    claim_in_one_statement,
    claim_in_transaction,
    migrate,
    pending_migrations,
)
from ._sql.placeholders import to_pyformat
from ._sql.retry import Blocks, KeyHeld, translator
from ._sql.store import Store, Transaction
from ._sql.store_async import AsyncStore, AsyncTransaction
from ._sql.transactions import TransactionStatements

__all__ = [
    "APPLICATION",
    "AsyncAutocommitConnection",
    "AsyncConnection",
    "AsyncFetcher",
    "AsyncSingleSource",
    "AsyncSource",
    "AsyncStore",
    "AsyncTransaction",
    "AutocommitConnection",
    "Blocks",
    "Connection",
    "Dialect",
    "Fetcher",
    "KeyHeld",
    "Op",
    "Query",
    "Row",
    "SingleSource",
    "Source",
    "Store",
    "Transaction",
    "TransactionStatements",
    "body",
    "body_async",
    "claim_in_one_statement",
    "claim_in_transaction",
    "migrate",
    "pending_migrations",
    "run",
    "run_async",
    "to_pyformat",
    "translator",
]
