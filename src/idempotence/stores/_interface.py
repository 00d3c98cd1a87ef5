"""The key-store interface: what ANY backend can honour (DESIGN 4, 8).

[`KeyStore`][idempotence.stores.redis.KeyStore] and
[`AsyncKeyStore`][idempotence.stores.redis.AsyncKeyStore] are the operations of a key
store that owns its own writes: claim a key atomically (P1-P6), then finish, release,
forget or heartbeat the lease, fenced by its token (F1, F2), read a record or a key's
status, wait for a twin (P10). A backend without transactions shared with the
application (Redis, whose claim is one Lua script) can implement them all.

A transactional store adds what only a SQL database can do, because the application
writes in the same database: [`transaction`][idempotence.stores.sql.Store.transaction],
``claim(..., tx=)`` and ``finish(..., tx=)``,
[`checkpoint`][idempotence.stores.sql.Store.checkpoint],
[`end_phase`][idempotence.stores.sql.Store.end_phase],
[`stage_jobs`][idempotence.stores.sql.Store.stage_jobs], and the maintenance services
(which reach its SQL through a private seam). Flows (R2: a phase's writes commit with
its checkpoint) and request-as-transaction (F3) need them, and so they take the SQL
classes [`Store`][idempotence.testing.harness.Store] /
[`AsyncStore`][idempotence.testing.harness.AsyncStore] (``Flow.run(store: Store,
...)``): a key store that is only a [`KeyStore`][idempotence.stores.redis.KeyStore] is
refused by type, and the HTTP configuration refuses it at construction for a
``transaction=True`` or ``flow=`` endpoint.

The SQL stores satisfy these protocols structurally (mypy checks it in
[`idempotence.stores`][idempotence.stores]), so code that only claims and settles keys is typed
against the protocol and runs on every backend:

```python
def replayed(store: KeyStore, request: ClaimRequest) -> bool:
    return store.claim(request).outcome is Outcome.REPLAY
```

The protocols are ``runtime_checkable``, but ``isinstance`` only sees method names,
which the sync and the async interface share:
[`is_async`][idempotence.stores.keyvalue.is_async] tells them apart.
"""

from __future__ import annotations

import inspect
from datetime import datetime
from typing import Protocol, TypeGuard, runtime_checkable

from ..states import Claim, ClaimRequest, KeyRecord, KeyStatus, Lease, StoredResponse

__all__ = ["AsyncKeyStore", "KeyStore", "is_async", "is_sync"]


@runtime_checkable
class KeyStore(Protocol):
    """A sync key store: the operations every backend honours, no shared transaction.

    Every write but the claim is fenced by the lease's token (F1): it raises
    [`LockLost`][idempotence.maintenance.completer_async.LockLost] when another worker
    took the key over.
    """

    def claim(self, request: ClaimRequest) -> Claim:
        """Claim ``request``'s key in one atomic step; return its single outcome (P1-P5)."""
        ...

    def finish(self, lease: Lease, response: StoredResponse, *, error: str | None = None) -> None:
        """Store ``response`` and unlock; ``error`` marks the key errored (R6)."""
        ...

    def release(self, lease: Lease) -> None:
        """Unlock without finishing: the next claim resumes (R5)."""
        ...

    def heartbeat(self, lease: Lease) -> datetime:
        """Extend the lock by its timeout from now; return the new expiry (F2)."""
        ...

    def forget(self, lease: Lease) -> None:
        """Delete a key still at ``started``: a rejected request stores nothing (R5)."""
        ...

    def get(self, scope: str, key: str) -> KeyRecord | None:
        """The key's current record, or None."""
        ...

    def key_status(self, scope: str, key: str) -> KeyStatus | None:
        """The key's state on the store's clock, with its times and stored status
        code; None for a key the store does not hold (never sent, or deleted)."""
        ...

    def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        """Wait up to ``seconds`` for a twin's claim to settle (P10); may return early."""
        ...

    def close(self) -> None:
        """Release the store's connections."""
        ...


@runtime_checkable
class AsyncKeyStore(Protocol):
    """The async twin of [`KeyStore`][idempotence.stores.redis.KeyStore]: every
    operation is awaitable."""

    async def claim(self, request: ClaimRequest) -> Claim: ...

    async def finish(
        self, lease: Lease, response: StoredResponse, *, error: str | None = None
    ) -> None: ...

    async def release(self, lease: Lease) -> None: ...

    async def heartbeat(self, lease: Lease) -> datetime: ...

    async def forget(self, lease: Lease) -> None: ...

    async def get(self, scope: str, key: str) -> KeyRecord | None: ...

    async def key_status(self, scope: str, key: str) -> KeyStatus | None: ...

    async def wait_for_settle(self, scope: str, key: str, seconds: float) -> None: ...

    async def close(self) -> None: ...


def is_async(store: KeyStore | AsyncKeyStore) -> TypeGuard[AsyncKeyStore]:
    """True when ``store``'s operations are coroutine functions (an async store).

    ```python
    from idempotence import AsyncSqliteStore, SqliteStore
    is_async(AsyncSqliteStore(":memory:")), is_async(SqliteStore(":memory:"))
    # (True, False)
    ```
    """
    return inspect.iscoroutinefunction(store.claim)


def is_sync(store: KeyStore | AsyncKeyStore) -> TypeGuard[KeyStore]:
    """True when ``store`` is a sync store: the negation of
    [`is_async`][idempotence.stores.keyvalue.is_async]."""
    return not inspect.iscoroutinefunction(store.claim)
