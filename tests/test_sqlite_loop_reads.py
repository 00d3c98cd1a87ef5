"""The async SQLite store reads on the event loop's own thread (DESIGN 8): a replay's
read skips the trip to a connection's thread, and still sees every commit at once."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from typing import Any

import pytest

from idempotence import AsyncSqliteStore, ClaimRequest, Outcome, StoredResponse
from idempotence.stores import sqlite as sqlite_module

FP = "f" * 64


def request(scope: str, key: str) -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint=FP)


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every function the store sends to a connection's thread."""
    sent: list[str] = []
    call = sqlite_module._ThreadedConnection._call

    async def counted(self: Any, fn: Any, *args: Any) -> Any:
        sent.append(getattr(fn, "__name__", None) or getattr(fn.func, "__name__", repr(fn)))
        return await call(self, fn, *args)

    monkeypatch.setattr(sqlite_module._ThreadedConnection, "_call", counted)
    return sent


def test_replays_and_gets_make_no_trip_to_a_thread(
    sqlite_path: str, scope: str, hops: list[str]
) -> None:
    async def main() -> None:
        async with AsyncSqliteStore(sqlite_path) as store:
            lease = (await store.claim(request(scope, "k"))).lease
            await store.finish(lease, StoredResponse.of(201, body="once"))
            await store.get(scope, "k")  # the reader is open now
            hops.clear()
            for _ in range(50):
                replay = await store.claim(request(scope, "k"))
                assert replay.outcome is Outcome.REPLAY
                assert replay.response is not None and replay.response.body == b"once"
                assert (await store.get(scope, "k")) is not None
            assert hops == []

    asyncio.run(main())


def test_a_read_on_the_loop_sees_another_connections_commit_at_once(
    sqlite_path: str, scope: str
) -> None:
    async def main() -> None:
        async with AsyncSqliteStore(sqlite_path) as store:
            assert await store.get(scope, "k") is None  # the reader is open now
            with contextlib.closing(sqlite3.connect(sqlite_path, isolation_level=None)) as other:
                other_store = sqlite_module.SqliteStore(other)
                lease = other_store.claim(request(scope, "k")).lease
                other_store.finish(lease, StoredResponse.of(201, body="there"))
            replay = await store.claim(request(scope, "k"))
            assert replay.outcome is Outcome.REPLAY
            assert replay.response is not None and replay.response.body == b"there"

    asyncio.run(main())


def test_a_read_after_close_is_refused(sqlite_path: str, scope: str) -> None:
    async def main() -> None:
        store = AsyncSqliteStore(sqlite_path)
        await store.get(scope, "k")
        await store.close()
        with pytest.raises(sqlite_module.StoreUnavailable):
            await store.get(scope, "k")

    asyncio.run(main())
