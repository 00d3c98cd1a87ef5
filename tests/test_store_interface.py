"""The key-store interface (issue 2): every SQL store is a KeyStore, and a key store
without shared transactions runs the claim lifecycle through the protocol alone."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from idempotence import (
    AsyncKeyStore,
    AsyncSqliteStore,
    AsyncStore,
    ClaimRequest,
    KeyStore,
    Outcome,
    SqliteStore,
    Store,
    StoredResponse,
)
from idempotence.stores._interface import is_async, is_sync
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from tests.support.keystores import AsyncNoSharedTransactions, NoSharedTransactions

# What a transactional (SQL) store adds: none of it is part of the interface.
SQL_ONLY = ("transaction", "checkpoint", "end_phase", "stage_jobs", "_perform", "migrate")


def _request(scope: str, key: str = "k", fingerprint: str = "f") -> ClaimRequest:
    return ClaimRequest(
        scope=scope, key=key, fingerprint=fingerprint, lock_timeout=timedelta(seconds=30)
    )


def test_sqlite_stores_are_key_stores(sqlite_path):
    with SqliteStore(sqlite_path) as store:
        assert isinstance(store, KeyStore)
        assert is_sync(store) and not is_async(store)
    store_async = AsyncSqliteStore(sqlite_path)
    assert isinstance(store_async, AsyncKeyStore)
    assert is_async(store_async) and not is_sync(store_async)
    asyncio.run(store_async.close())


def test_postgres_stores_are_key_stores(pg_url):
    with PostgresStore(pg_url) as store:
        assert isinstance(store, KeyStore)
        assert is_sync(store)
    store_async = AsyncPostgresStore(pg_url)
    assert isinstance(store_async, AsyncKeyStore)
    assert is_async(store_async)
    asyncio.run(store_async.close())


def test_the_interface_holds_nothing_that_needs_a_shared_transaction():
    for protocol in (KeyStore, AsyncKeyStore):
        assert not any(hasattr(protocol, name) for name in SQL_ONLY)
    assert all(hasattr(Store, name) and hasattr(AsyncStore, name) for name in SQL_ONLY)


def test_a_key_store_without_transactions_runs_the_claim_lifecycle(sqlite_path, scope):
    store = NoSharedTransactions(SqliteStore(sqlite_path))
    assert isinstance(store, KeyStore) and not isinstance(store, Store)
    assert not any(hasattr(store, name) for name in SQL_ONLY)
    try:
        claim = store.claim(_request(scope))
        assert claim.outcome is Outcome.EXECUTE and claim.lease is not None
        assert isinstance(store.heartbeat(claim.lease), datetime)
        assert store.claim(_request(scope)).outcome is Outcome.IN_PROGRESS
        store.finish(claim.lease, StoredResponse.of(201, body="done"))
        replay = store.claim(_request(scope))
        assert replay.outcome is Outcome.REPLAY and replay.record.response is not None
        assert replay.record.response.body == b"done"
        assert store.claim(_request(scope, fingerprint="other")).outcome is Outcome.MISMATCH

        rejected = store.claim(_request(scope, "rejected"))
        assert rejected.lease is not None
        store.forget(rejected.lease)
        assert store.get(scope, "rejected") is None

        released = store.claim(_request(scope, "released"))
        assert released.lease is not None
        store.release(released.lease)
        store.wait_for_settle(scope, "released", 0.01)
        assert store.claim(_request(scope, "released")).outcome is Outcome.EXECUTE
    finally:
        store.close()


def test_an_async_key_store_without_transactions_runs_the_claim_lifecycle(sqlite_path, scope):
    async def main() -> None:
        store = AsyncNoSharedTransactions(AsyncSqliteStore(sqlite_path))
        assert isinstance(store, AsyncKeyStore) and is_async(store)
        try:
            claim = await store.claim(_request(scope))
            assert claim.outcome is Outcome.EXECUTE and claim.lease is not None
            assert isinstance(await store.heartbeat(claim.lease), datetime)
            await store.finish(claim.lease, StoredResponse.of(201, body="done"))
            assert (await store.claim(_request(scope))).outcome is Outcome.REPLAY
            record = await store.get(scope, "k")
            assert record is not None and record.response is not None
        finally:
            await store.close()

    asyncio.run(main())
