"""F8 through real servers on PostgreSQL: duplicates of a slow request-as-transaction
request never hold the store's pooled connections while the first one runs.

The store's pool is small (POOL connections) and more duplicates than that arrive while
the first copy's handler runs for seconds. A duplicate that waited for the first's
transaction on a pooled connection would empty the pool: other keys would then wait
for a connection, and get 503 once the pool's timeout ran out. Instead they keep
their latency, the duplicates get 409 + Retry-After (or, with ``wait``, the replay
once the first commits), and the handler runs once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
import pytest

from idempotence.http import Endpoint, Idempotency, Policy, current_async_transaction
from idempotence.http import current_transaction as current_sync_transaction
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from tests.http.servers import uvicorn_server, waitress_server

POOL = 3
DUPLICATES = 5
OTHERS = 6
HANDLER_SECONDS = 3.0
#: The store reports itself unavailable (503) after waiting this long for a connection.
POOL_TIMEOUT = 2.0
#: What "normal latency" means here: far below the pool timeout and the handler.
FAST = 1.0
INSERT = "INSERT INTO f8_writes (scope, note) VALUES (%(scope)s, %(note)s)"


class Runs:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def hit(self, path: str) -> None:
        with self.lock:
            self.counts[path] += 1


def config(store: Any) -> Idempotency:
    tx = Policy(transaction=True)
    return Idempotency(
        store=store,
        scope=lambda request: "f8",
        endpoints=[
            Endpoint("POST /slow", tx),
            Endpoint("POST /slow-wait", Policy(transaction=True, wait=timedelta(seconds=10))),
            Endpoint("POST /fast", tx),
        ],
    )


def starlette_app(store: Any, runs: Runs) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from idempotence.http import IdempotencyMiddleware

    async def endpoint(request: Request) -> Response:
        path = request.url.path
        runs.hit(path)
        await current_async_transaction().execute(INSERT, {"scope": "f8", "note": path})
        if path.startswith("/slow"):
            await asyncio.sleep(HANDLER_SECONDS)
        return Response(f"done {path}", status_code=201)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await store.close()

    routes = [Route("/{path:path}", endpoint, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(IdempotencyMiddleware, config=config(store))
    return app


def flask_app(store: Any, runs: Runs) -> Any:
    from flask import Flask, request

    from idempotence.contrib.flask import install

    app = Flask("idempotence-f8-tests")

    @app.route("/<path:path>", methods=["POST"])
    def endpoint(path: str) -> Any:
        path = request.path
        runs.hit(path)
        current_sync_transaction().execute(INSERT, {"scope": "f8", "note": path})
        if path.startswith("/slow"):
            time.sleep(HANDLER_SECONDS)
        return f"done {path}", 201

    install(app, config(store))
    return app


@pytest.fixture(scope="module")
def f8_url(pg_url: str) -> str:
    with PostgresStore(pg_url) as store, store.transaction() as tx:
        tx.execute("CREATE TABLE IF NOT EXISTS f8_writes (scope TEXT, note TEXT)")
    return pg_url


@contextmanager
def serving(server: str, url: str) -> Iterator[tuple[str, Runs]]:
    runs = Runs()
    if server == "uvicorn":
        store: Any = AsyncPostgresStore(url, max_size=POOL, connect_timeout=POOL_TIMEOUT)
        with uvicorn_server(starlette_app(store, runs)) as base:
            yield base, runs
    else:
        with (
            PostgresStore(url, max_size=POOL, connect_timeout=POOL_TIMEOUT) as store,
            waitress_server(flask_app(store, runs)) as base,
        ):
            yield base, runs


def post(base: str, path: str, key: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    with httpx.Client(base_url=base, timeout=30) as client:
        response = client.post(path, content=b"{}", headers={"idempotency-key": key})
    return response, time.monotonic() - started


def probe(base: str, path: str, key: str) -> tuple[list[Any], list[Any]]:
    """DUPLICATES copies of ``path`` with ``key``; once they are all in, OTHERS
    requests with keys of their own, one after the other."""
    with ThreadPoolExecutor(DUPLICATES) as pool:
        duplicates = [pool.submit(post, base, path, key)]
        time.sleep(0.3)  # the first copy holds the key
        duplicates += [pool.submit(post, base, path, key) for _ in range(DUPLICATES - 1)]
        time.sleep(0.5)  # the duplicates are in (and, before F8, on the key's row lock)
        others = [post(base, "/fast", f"{key}-other-{n}") for n in range(OTHERS)]
        return [future.result() for future in duplicates], others


@pytest.mark.slow
@pytest.mark.parametrize("server", ["uvicorn", "waitress"])
def test_f8_duplicates_of_a_slow_transaction_do_not_starve_other_keys(
    server: str, f8_url: str, scope: str
) -> None:
    with serving(server, f8_url) as (base, runs):
        duplicates, others = probe(base, "/slow", f"{scope}-slow")
    for response, seconds in others:
        assert response.status_code == 201, response.text
        assert seconds < FAST, seconds
    statuses = Counter(response.status_code for response, _ in duplicates)
    assert statuses == {201: 1, 409: DUPLICATES - 1}, statuses
    for response, seconds in duplicates:
        if response.status_code == 409:
            assert int(response.headers["retry-after"]) >= 1
            assert seconds < FAST, seconds  # answered at once, not after the handler
    assert runs.counts["/slow"] == 1
    assert runs.counts["/fast"] == OTHERS


@pytest.mark.slow
@pytest.mark.parametrize("server", ["uvicorn", "waitress"])
def test_f8_waiting_duplicates_replay_without_starving_other_keys(
    server: str, f8_url: str, scope: str
) -> None:
    with serving(server, f8_url) as (base, runs):
        duplicates, others = probe(base, "/slow-wait", f"{scope}-wait")
    for response, seconds in others:
        assert response.status_code == 201, response.text
        assert seconds < FAST, seconds
    # The duplicates waited (outside any transaction) for the first to commit, then
    # replayed its response.
    assert [r.status_code for r, _ in duplicates] == [201] * DUPLICATES
    assert len({r.content for r, _ in duplicates}) == 1
    assert sum("idempotent-replayed" in r.headers for r, _ in duplicates) == DUPLICATES - 1
    assert runs.counts["/slow-wait"] == 1
