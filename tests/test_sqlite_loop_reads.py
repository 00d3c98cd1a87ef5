"""The async SQLite store reads on the event loop's own thread (DESIGN 8): a replay's
read skips the trip to a connection's thread, and still sees every commit at once."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import time
from typing import Any

import pytest

from idempotence import AsyncSqliteStore, ClaimRequest, Outcome, StoredResponse
from idempotence.stores.sqlite import _store as sqlite_module

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


#: Run in another process: act as a connection recovering the WAL of the database
#: whose ``-shm`` file is argv[1]. It holds the write and the recovery locks of the
#: WAL index (byte 120 + lock number: SQLite's unix VFS) and leaves the index header
#: invalid, so a reader finds the index needs recovering and another connection at
#: it: SQLITE_BUSY_RECOVERY. On a line on stdin it puts the header back and lets go.
RECOVERING = """
import fcntl, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 120)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 122)
index = mmap.mmap(fd, 136)
header = index[:96]
index[:96] = bytes(96)
print("recovering", flush=True)
sys.stdin.readline()
index[:96] = header
"""


def test_a_read_that_finds_the_database_busy_goes_to_the_connections_thread(
    sqlite_path: str, scope: str, hops: list[str]
) -> None:
    """The reader on the loop never waits (its busy timeout is zero): a statement
    that finds the database busy (another connection recovering the WAL) runs again
    on the caller's connection's thread, which waits for it, and answers right."""

    async def main() -> None:
        async with AsyncSqliteStore(sqlite_path) as store:
            lease = (await store.claim(request(scope, "k"))).lease
            await store.finish(lease, StoredResponse.of(201, body="once"))
            assert await store.get(scope, "k") is not None  # the reader is open now
            hops.clear()
            recovering = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                RECOVERING,
                sqlite_path + "-shm",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            assert recovering.stdin is not None and recovering.stdout is not None
            try:
                assert await recovering.stdout.readline() == b"recovering\n"
                started = time.monotonic()
                replay = asyncio.create_task(store.claim(request(scope, "k")))
                deadline = started + 10
                while "fetch" not in hops:  # the read went to the thread
                    assert time.monotonic() < deadline, "the read never left the loop"
                    await asyncio.sleep(0.001)
                # At once: the loop's reader did not wait in SQLite's busy handler (the
                # store's busy timeout is 5 s); the thread waits, and the loop runs on.
                assert time.monotonic() - started < 1.0
                assert not replay.done()
            finally:
                recovering.stdin.write(b"\n")
                await recovering.stdin.drain()
                assert await recovering.wait() == 0
            answer = await asyncio.wait_for(replay, 10)
            assert answer.outcome is Outcome.REPLAY
            assert answer.response is not None and answer.response.body == b"once"

    asyncio.run(main())
