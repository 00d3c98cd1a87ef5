"""The key-store interface (issue 2): every store has the KeyStore operations with
their signatures, and a key store without shared transactions runs the claim
lifecycle through the protocol alone.

``isinstance`` on the runtime-checkable protocols only sees method names (which the
sync and the async interface share), so the stores are checked here method by
method: each operation of the protocol is there, a coroutine function exactly on an
async store, and takes the protocol's parameters by the same names and kinds."""

from __future__ import annotations

import asyncio
import inspect
from datetime import datetime, timedelta

import pytest

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
from tests.support.keystores import AsyncNoSharedTransactions, NoSharedTransactions
from tests.support.stores import STORES, opener

# What a transactional (SQL) store adds: none of it is part of the interface.
SQL_ONLY = ("transaction", "checkpoint", "end_phase", "stage_jobs", "_perform", "migrate")


def _request(scope: str, key: str = "k", fingerprint: str = "f") -> ClaimRequest:
    return ClaimRequest(
        scope=scope, key=key, fingerprint=fingerprint, lock_timeout=timedelta(seconds=30)
    )


def conforms(store: object, protocol: type) -> list[str]:
    """How ``store`` departs from ``protocol``'s operations (nothing: it conforms)."""
    wrong = []
    for name in ("claim", "finish", "release", "heartbeat", "forget", "get"):
        wanted = getattr(protocol, name)
        method = getattr(store, name, None)
        if method is None:
            wrong.append(f"{name}: missing")
            continue
        if inspect.iscoroutinefunction(method) != inspect.iscoroutinefunction(wanted):
            wrong.append(f"{name}: async where the protocol is sync, or the reverse")
        have = inspect.signature(method).parameters
        params = inspect.signature(wanted).parameters
        for param in list(params.values())[1:]:  # not self
            mine = have.get(param.name)
            if mine is None or mine.kind != param.kind:
                wrong.append(f"{name}: no {param.kind.description} parameter {param.name!r}")
        extra = [
            p.name
            for p in have.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        wrong += [
            f"{name}: requires {p!r}"
            for p in extra
            if p not in inspect.signature(wanted).parameters
        ]
    for name in ("wait_for_settle", "close"):
        method = getattr(store, name, None)
        if method is None or inspect.iscoroutinefunction(method) != inspect.iscoroutinefunction(
            getattr(protocol, name)
        ):
            wrong.append(f"{name}: missing, or of the other flavour")
    return wrong


@pytest.mark.parametrize("kind", list(STORES))
def test_every_store_has_the_key_store_operations(kind: str, request: pytest.FixtureRequest):
    store = opener(kind, request)()
    try:
        if is_async(store):
            assert conforms(store, AsyncKeyStore) == []
            assert conforms(store, KeyStore) != []  # the check tells the flavours apart
        else:
            assert is_sync(store)
            assert conforms(store, KeyStore) == []
            assert conforms(store, AsyncKeyStore) != []
    finally:
        close = store.close()
        if inspect.iscoroutine(close):
            asyncio.run(close)


def test_the_check_sees_a_missing_parameter_and_an_extra_required_one(sqlite_path):
    class Partial(NoSharedTransactions):
        def finish(self, lease, response):  # no error=
            ...

        def get(self, scope, key, shard):  # one more, required
            ...

    with SqliteStore(sqlite_path) as inner:
        assert conforms(Partial(inner), KeyStore) == [
            "finish: no keyword-only parameter 'error'",
            "get: requires 'shard'",
        ]


def test_the_interface_holds_nothing_that_needs_a_shared_transaction():
    for protocol in (KeyStore, AsyncKeyStore):
        assert not any(hasattr(protocol, name) for name in SQL_ONLY)
    assert all(hasattr(Store, name) and hasattr(AsyncStore, name) for name in SQL_ONLY)


def test_a_key_store_without_transactions_runs_the_claim_lifecycle(sqlite_path, scope):
    store = NoSharedTransactions(SqliteStore(sqlite_path))
    assert conforms(store, KeyStore) == []
    assert not isinstance(store, Store)
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
        assert conforms(store, AsyncKeyStore) == []
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
