"""The machinery every SQL store runs on, whatever its database (DESIGN 4, 6, 11).

A SQL store is a dialect (its ``queries.sql`` and a few decisions,
[`ops.Dialect`][idempotence.stores._sql.ops.Dialect]) plus a connection and a source of
connections; everything else is written once, here: the operations as generators of
queries (`ops`), the store classes that choose a connection and a transaction for them
(`store_async`, and `store` generated from it), the runners that feed an operation to a
connection (`connection_async`, `connection`), natural batching (`batch_plan` decides,
`batcher` waits), the gate every store's own connections pass (`gate`), the retry policy
and the operations deferred to a commit (`retry`), and the one placeholder style for the
application's SQL (`placeholders`).

Why a package of its own: ``stores/`` holds one package per backend (``postgres/``,
``sqlite/``, ``redis/``, ``cached/``) and, as flat private modules, what EVERY store
shares, SQL or key-value (the key-store protocols, the refusal of a fenced write, the
waiting for a twin). What only SQL stores share sits here, so a Redis store visibly does not depend
on it, and a new SQL backend finds everything it builds on in one place. Nothing here
imports a database driver. The supported names are re-exported, documented, by
[`idempotence.stores.sql`][idempotence.stores.sql].
"""
