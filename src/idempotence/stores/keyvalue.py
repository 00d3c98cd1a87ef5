"""The key-value store interface: what a store that owns its own writes supplies.

A key-value store (the Redis store is one) shares no transaction with the application,
so it serves plain handler endpoints and consumers, not flows or request-as-transaction.
It implements [`KeyStore`][idempotence.stores.KeyStore] (or
[`AsyncKeyStore`][idempotence.stores.AsyncKeyStore]): claim a key atomically, then
finish, release, forget or heartbeat the lease, each fenced by the lease's token, read a
record, and wait for a twin. Everything else (the HTTP middleware, the consumers, the
client) is written against these protocols.

How it decides is not its own: a claim reads or writes the record in one atomic step of
the backend (a Lua script, a conditional write) and hands what it saw to `claim_from`,
which names the outcome, so the states a key goes through are decided in one place for
every store. [`is_sync`][idempotence.stores.keyvalue.is_sync] and
[`is_async`][idempotence.stores.keyvalue.is_async] tell the two flavours apart
(``isinstance`` on these protocols only sees method names, which both share).

Example:
    ```python
    from idempotence.stores.keyvalue import KeyStore

    def serve(store: KeyStore) -> None:   # any backend: Redis, PostgreSQL, SQLite
        ...
    ```
"""

from __future__ import annotations

from ._interface import AsyncKeyStore, KeyStore, is_async, is_sync

__all__ = ["AsyncKeyStore", "KeyStore", "is_async", "is_sync"]
