"""A run that is cancelled or interrupted mid-phase unlocks its key (R5), so the
client's retry resumes at once instead of waiting out the lock timeout (P4)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from idempotence import AsyncSqliteStore, Outcome, SqliteStore, StoredResponse
from idempotence.flows import Advance, Finish, Flow


def interrupted_flow(name: str, error: BaseException) -> Flow:
    flow = Flow(name)
    calls: list[int] = []

    @flow.phase("started")
    def first(ctx: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return Finish(StoredResponse.of(201, body="done"))

    return flow


def test_r5_an_interrupted_phase_unlocks_its_key(sqlite_path: str, scope: str) -> None:
    store = SqliteStore(sqlite_path)
    flow = interrupted_flow("interrupted", KeyboardInterrupt())
    request = flow.request(scope=scope, key="k", fingerprint="f")
    with pytest.raises(KeyboardInterrupt):
        flow.run(store, request)
    record = store.get(scope, "k")
    assert record.locked_at is None  # released, not left locked for 60 s
    assert flow.run(store, request).response.body == b"done"
    store.close()


def test_r5_a_cancelled_async_run_unlocks_its_key(sqlite_path: str, scope: str) -> None:
    flow = Flow("cancelled")
    started = asyncio.Event()

    @flow.phase("started")
    async def slow(ctx: Any) -> Any:
        started.set()
        await asyncio.sleep(30)  # the client disconnects meanwhile
        return Advance("never")

    async def main() -> None:
        store = AsyncSqliteStore(sqlite_path)
        request = flow.request(scope=scope, key="k", fingerprint="f")
        task = asyncio.create_task(flow.run_async(store, request))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        claim = await store.claim(request)
        assert claim.outcome is Outcome.EXECUTE  # at once: the lock was released
        assert claim.lease.token == 2
        await store.close()

    asyncio.run(main())
