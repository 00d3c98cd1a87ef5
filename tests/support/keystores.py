"""Key stores that share no transaction with the application, built of real parts.

:class:`NoSharedTransactions` wraps a real SQL store and exposes only the
:class:`~idempotence.KeyStore` operations: no ``transaction()``, no ``tx=``, no
checkpoint. It stands in for a backend such as Redis (an atomic claim, nothing to
share with the application's writes) without faking one: every operation runs on
the real store underneath.
"""

from __future__ import annotations

from datetime import datetime

from idempotence import (
    AsyncStore,
    Claim,
    ClaimRequest,
    KeyRecord,
    KeyStatus,
    Lease,
    Store,
    StoredResponse,
)
from idempotence.stores.capabilities import Capability


class NoSharedTransactions:
    """A sync :class:`~idempotence.KeyStore` on a real :class:`~idempotence.Store`."""

    #: What a key-value store declares: it waits (by the SQL store's polling here).
    capabilities = frozenset({Capability.WAITING})

    def __init__(self, store: Store) -> None:
        self._store = store

    def claim(self, request: ClaimRequest) -> Claim:
        return self._store.claim(request)

    def finish(self, lease: Lease, response: StoredResponse, *, error: str | None = None) -> None:
        self._store.finish(lease, response, error=error)

    def release(self, lease: Lease) -> None:
        self._store.release(lease)

    def heartbeat(self, lease: Lease) -> datetime:
        return self._store.heartbeat(lease)

    def forget(self, lease: Lease) -> None:
        self._store.forget(lease)

    def get(self, scope: str, key: str) -> KeyRecord | None:
        return self._store.get(scope, key)

    def key_status(self, scope: str, key: str) -> KeyStatus | None:
        return self._store.key_status(scope, key)

    def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        self._store.wait_for_settle(scope, key, seconds)

    def close(self) -> None:
        self._store.close()


class AsyncNoSharedTransactions:
    """An :class:`~idempotence.AsyncKeyStore` on a real :class:`~idempotence.AsyncStore`."""

    capabilities = NoSharedTransactions.capabilities

    def __init__(self, store: AsyncStore) -> None:
        self._store = store

    async def claim(self, request: ClaimRequest) -> Claim:
        return await self._store.claim(request)

    async def finish(
        self, lease: Lease, response: StoredResponse, *, error: str | None = None
    ) -> None:
        await self._store.finish(lease, response, error=error)

    async def release(self, lease: Lease) -> None:
        await self._store.release(lease)

    async def heartbeat(self, lease: Lease) -> datetime:
        return await self._store.heartbeat(lease)

    async def forget(self, lease: Lease) -> None:
        await self._store.forget(lease)

    async def get(self, scope: str, key: str) -> KeyRecord | None:
        return await self._store.get(scope, key)

    async def key_status(self, scope: str, key: str) -> KeyStatus | None:
        return await self._store.key_status(scope, key)

    async def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        await self._store.wait_for_settle(scope, key, seconds)

    async def close(self) -> None:
        await self._store.close()
