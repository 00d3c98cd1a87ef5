"""Request-as-transaction (F3) costs the async SQLite store no trip to the connection's
thread beyond what the bare transaction makes: the claim rides with the BEGIN and the
deferred finish with the COMMIT. Each trip is time the one write lock is held."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from idempotence import AsyncSqliteStore, ClaimRequest, Outcome, StoredResponse
from idempotence.stores import sqlite as sqlite_store

INSERT = "INSERT INTO side_effects (note) VALUES (:note)"


def _request(key: str) -> ClaimRequest:
    return ClaimRequest(scope="trips", key=key, fingerprint="f", lock_timeout=timedelta(seconds=30))


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every call the async SQLite store sends to a connection's thread."""
    seen: list[str] = []
    real = sqlite_store._ThreadedConnection._call

    async def counted(self: Any, fn: Any, *args: Any) -> Any:
        seen.append(getattr(fn, "__name__", type(fn).__name__))
        return await real(self, fn, *args)

    monkeypatch.setattr(sqlite_store._ThreadedConnection, "_call", counted)
    return seen


def test_f3_a_claimed_transaction_makes_as_many_trips_as_a_bare_one(sqlite_path, trips):
    async def main() -> tuple[int, int]:
        store = AsyncSqliteStore(sqlite_path)
        try:
            await store.migrate()
            async with store.transaction() as tx:
                await tx.execute("CREATE TABLE side_effects (note TEXT)")
            trips.clear()
            async with store.transaction() as tx:
                await tx.execute(INSERT, {"note": "bare"})
            bare = len(trips)
            trips.clear()
            async with store.transaction(claim=_request("k1")) as tx:
                assert tx.claim is not None and tx.claim.outcome is Outcome.EXECUTE
                assert tx.claim.lease is not None
                await tx.execute(INSERT, {"note": "guarded"})
                response = StoredResponse.of(201, body="{}")
                await store.finish(tx.claim.lease, response, tx=tx, at_commit=True)
            guarded = len(trips)
            replay = await store.claim(_request("k1"))
            assert replay.outcome is Outcome.REPLAY and replay.response == response
            return bare, guarded
        finally:
            await store.close()

    bare, guarded = asyncio.run(main())
    assert bare == 3  # BEGIN, the INSERT, COMMIT
    assert guarded == bare, f"{guarded} trips for a claimed transaction, {bare} bare"
