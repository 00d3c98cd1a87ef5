"""F3: request-as-transaction. The claim, the handler's writes and the response commit in
one transaction, so there is no crash window: 32 racing duplicates run the handler
once, and a failing handler leaves no trace, not even its key."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from idempotence import AsyncSqliteStore, ConfigurationError, SqliteStore
from idempotence.flows import Flow, Reject, ResultKind, problem
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from tests.flows.support import finish, noting, raising, request

DUPLICATES = 32
HANDLER_SECONDS = 0.2  # long enough that every duplicate arrives while it runs
WAIT = timedelta(seconds=10)  # P10: the duplicates wait for the winner, then replay


def handler_flow(
    *, fail: BaseException | None = None, until: threading.Event | None = None
) -> Flow:
    """The F3 test flow; its handler sleeps, or runs ``until`` the event is set."""
    flow = Flow("f3", request_as_transaction=True)

    def respond(ctx: Any) -> Any:
        if until is None:
            time.sleep(HANDLER_SECONDS)
        else:
            until.wait(timeout=10)
        if fail is not None:
            raise fail
        return finish(201, f"handled by key row {ctx.lease.id}")

    flow.phase("started")(noting("handled", respond))
    return flow


@pytest.fixture
def f3_store(backend: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    if backend == "postgres":
        store: Any = PostgresStore(request.getfixturevalue("pg_flows_url"), max_size=DUPLICATES)
    else:
        store = SqliteStore(request.getfixturevalue("sqlite_flows_path"))
    yield store
    store.close()


def notes(store: Any, backend: str, scope: str) -> list[str]:
    with store.transaction() as tx:
        rows = tx.execute("SELECT note FROM flow_notes WHERE scope = :scope", {"scope": scope})
    return [row["note"] for row in rows]


@pytest.mark.parametrize("wait", [None, WAIT], ids=["no-wait", "wait"])
def test_f3_32_concurrent_duplicates_run_the_handler_once(
    f3_store: Any, backend: str, scope: str, wait: timedelta | None
) -> None:
    # F8 on PostgreSQL without wait: the winner's handler runs until every duplicate
    # has had its answer, so each one is answered while the winner's transaction is
    # open, however slowly a loaded machine starts the threads. A duplicate that
    # waited on the row lock instead would hold the winner up for 10 s, then replay.
    f8 = backend == "postgres" and wait is None
    answered: list[Any] = []
    all_answered = threading.Event()
    flow = handler_flow(until=all_answered if f8 else None)
    barrier = threading.Barrier(DUPLICATES)

    def one(_: int) -> Any:
        barrier.wait()
        result = flow.run(f3_store, request(flow, scope), wait=wait)
        if result.kind is not ResultKind.EXECUTED:
            answered.append(result)  # list.append is atomic under the GIL
            if len(answered) == DUPLICATES - 1:
                all_answered.set()
        return result

    with ThreadPoolExecutor(DUPLICATES) as pool:
        results = list(pool.map(one, range(DUPLICATES)))
    kinds = Counter(result.kind for result in results)
    if f8:
        # F8: a duplicate does not wait for the winner's transaction on a pooled
        # connection; it is told the key is in progress (409), never half-done.
        assert all_answered.is_set()
        assert kinds == {ResultKind.EXECUTED: 1, ResultKind.IN_PROGRESS: DUPLICATES - 1}
    else:
        # The duplicates wait for the winner's transaction (PostgreSQL: polling
        # outside any transaction; SQLite: on the write lock) and replay its
        # response; none may see the key half-done or run the handler again.
        assert kinds == {ResultKind.EXECUTED: 1, ResultKind.REPLAYED: DUPLICATES - 1}
        assert len({result.response for result in results}) == 1
    assert notes(f3_store, backend, scope) == ["handled"]


def test_f3_a_handler_exception_rolls_back_everything_including_the_claim(
    f3_store: Any, backend: str, scope: str
) -> None:
    result = handler_flow(fail=RuntimeError("handler bug")).run(
        f3_store, request(handler_flow(), scope)
    )
    assert (result.kind, result.claim, result.stored) == (ResultKind.FAILED, None, False)
    assert result.response is not None and result.response.status == 500
    assert f3_store.get(scope, "k") is None  # no key, no writes, no crash window
    assert notes(f3_store, backend, scope) == []

    again = handler_flow().run(f3_store, request(handler_flow(), scope))
    assert again.kind is ResultKind.EXECUTED
    assert notes(f3_store, backend, scope) == ["handled"]


def test_f3_a_reject_rolls_back_the_claim(f3_store: Any, backend: str, scope: str) -> None:
    flow = handler_flow(fail=Reject(problem(422, "Invalid", "no such seat")))
    result = flow.run(f3_store, request(flow, scope))
    assert (result.kind, result.claim, result.stored) == (ResultKind.REJECTED, None, False)
    assert f3_store.get(scope, "k") is None
    assert notes(f3_store, backend, scope) == []


def test_f3_32_concurrent_async_duplicates_run_the_handler_once(
    backend: str, request: pytest.FixtureRequest, scope: str
) -> None:
    if backend == "postgres":
        url = request.getfixturevalue("pg_flows_url")
        p = "%(scope)s"
    else:
        path = request.getfixturevalue("sqlite_flows_path")
        p = ":scope"
    flow = Flow("f3-async", request_as_transaction=True)

    @flow.phase("started")
    async def handle(ctx: Any) -> Any:  # a coroutine phase: async only
        await ctx.tx.execute(
            f"INSERT INTO flow_notes (scope, key_id, note) VALUES ({p}, NULL, 'handled')",
            {"scope": scope},
        )
        await asyncio.sleep(HANDLER_SECONDS)
        return finish(201, "async")

    async def main() -> tuple[list[Any], list[Any]]:
        store: Any = (
            AsyncPostgresStore(url, max_size=DUPLICATES)
            if backend == "postgres"
            else AsyncSqliteStore(path)
        )
        try:
            req = flow.request(scope=scope, key="k", fingerprint="f" * 64)
            results = await asyncio.gather(
                *(flow.run_async(store, req, wait=WAIT) for _ in range(DUPLICATES))
            )
            async with store.transaction() as tx:
                rows = await tx.execute(
                    f"SELECT note FROM flow_notes WHERE scope = {p}", {"scope": scope}
                )
            return list(results), rows
        finally:
            await store.close()

    results, rows = asyncio.run(main())
    kinds = Counter(result.kind for result in results)
    assert kinds == {ResultKind.EXECUTED: 1, ResultKind.REPLAYED: DUPLICATES - 1}
    assert len(rows) == 1


def test_f3_a_request_as_transaction_flow_has_one_atomic_phase_at_started() -> None:
    flow = Flow("f3-shape", request_as_transaction=True)
    with pytest.raises(ConfigurationError, match="one atomic phase"):
        flow.phase("later")(noting("x", raising(RuntimeError())))
    with pytest.raises(ConfigurationError, match="one atomic phase"):
        flow.foreign("started", name="charge", call=lambda ctx: None, record=lambda c, r: None)
