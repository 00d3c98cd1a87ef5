"""Through real servers on 127.0.0.1: uvicorn (Starlette, async store) and waitress
(Flask, sync store), on SQLite and PostgreSQL.

32 identical POSTs start together, 50 times over: each key runs exactly once, and
every other copy gets a 409 or the replayed response. Zero duplicates.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tests.http import apps
from tests.http.clients import async_store, sync_store
from tests.http.servers import uvicorn_server, waitress_server

#: The slow tier: real servers (uvicorn, Hypercorn, Granian, waitress).
pytestmark = pytest.mark.slow

TRIALS = 50
CONCURRENCY = 32


@pytest.fixture(params=["uvicorn", "waitress"])
def server(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@contextmanager
def running(server: str, backend: str, target: str) -> Iterator[tuple[str, apps.Effects]]:
    effects = apps.Effects(backend)
    if server == "uvicorn":
        store = async_store(backend, target)

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            yield
            await store.close()

        app = apps.starlette_app(effects, apps.make_config(store), lifespan=lifespan)
        with uvicorn_server(app) as url:
            yield url, effects
    else:
        with (
            sync_store(backend, target) as store,
            waitress_server(apps.flask_app(effects, apps.make_config(store))) as url,
        ):
            yield url, effects


class Racers:
    """32 threads, each with its own keep-alive connection, that post together."""

    def __init__(self, base_url: str, tenant: str) -> None:
        self.base_url = base_url
        self.tenant = tenant
        self.local = threading.local()
        self.pool = ThreadPoolExecutor(CONCURRENCY)
        self.clients: list[httpx.Client] = []

    def _client(self) -> httpx.Client:
        client = getattr(self.local, "client", None)
        if client is None:
            # TCP_NODELAY: httpx writes the head and the body separately, and Nagle's
            # algorithm would hold the body back for the server's delayed ACK (40 ms).
            nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
            transport = httpx.HTTPTransport(socket_options=nodelay)
            client = httpx.Client(base_url=self.base_url, timeout=30, transport=transport)
            self.local.client = client
            self.clients.append(client)
        return client

    def race(self, path: str, key: str) -> list[httpx.Response]:
        barrier = threading.Barrier(CONCURRENCY)

        def one() -> httpx.Response:
            client = self._client()
            barrier.wait()
            return client.post(
                path,
                json={"amount": 100},
                headers={"idempotency-key": key, apps.TENANT_HEADER: self.tenant},
            )

        futures = [self.pool.submit(one) for _ in range(CONCURRENCY)]
        return [future.result() for future in futures]

    def close(self) -> None:
        self.pool.shutdown()
        for client in self.clients:
            client.close()


@contextmanager
def racers_at(base_url: str, tenant: str) -> Iterator[Racers]:
    """Racers, closed at the end of the ``with`` (before the server stops: a server
    waits for its open connections)."""
    racers = Racers(base_url, tenant)
    try:
        yield racers
    finally:
        racers.close()


@pytest.fixture
def racers_for(scope: str) -> Any:
    """:func:`racers_at` for the test's scope: ``with racers_for(url) as racers``."""
    return lambda base_url: racers_at(base_url, scope)


def check_trial(responses: list[httpx.Response], *, allow_409: bool) -> None:
    statuses = sorted(response.status_code for response in responses)
    allowed = {201, 409} if allow_409 else {201}
    assert set(statuses) <= allowed, statuses
    originals = [
        r for r in responses if r.status_code == 201 and "idempotent-replayed" not in r.headers
    ]
    assert len(originals) == 1, statuses  # exactly one execution answered first-hand
    bodies = {r.content for r in responses if r.status_code == 201}
    assert len(bodies) == 1  # every replay is the original, verbatim
    for response in responses:
        if response.status_code == 409:
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["code"] == "idempotency_key_in_use"


def race_trials(racers: Racers, effects: apps.Effects) -> None:
    """TRIALS races of 32 copies on /slow: each key runs once (also on Redis)."""
    conflicts = 0
    for trial in range(TRIALS):
        responses = racers.race("/slow", f"race-{trial}")
        check_trial(responses, allow_409=True)
        assert effects.counts["/slow"] == trial + 1, f"duplicate execution in trial {trial}"
        conflicts += sum(r.status_code == 409 for r in responses)
    assert conflicts > 0  # the copies did overlap the 20 ms handler: a real race


@pytest.mark.slow
def test_p6_concurrent_identical_posts_execute_once(server, backend, target, racers_for):
    with running(server, backend, target) as (url, effects), racers_for(url) as racers:
        race_trials(racers, effects)


@pytest.mark.slow
def test_f3_concurrent_identical_posts_commit_once_and_the_rest_replay(
    server, backend, target, racers_for, scope
):
    with running(server, backend, target) as (url, effects), racers_for(url) as racers:
        for trial in range(TRIALS):
            # Request-as-transaction: on SQLite a duplicate waits for the first to
            # commit (on the write lock) and replays: no 409 at all. On PostgreSQL it
            # does not wait on a pooled connection (F8): a replay or a 409.
            responses = racers.race("/tx/race", f"race-tx-{trial}")
            check_trial(responses, allow_409=backend == "postgres")
        assert effects.counts["/tx/race"] == TRIALS
    with sync_store(backend, target) as store, store.transaction() as tx:
        rows = tx.execute("SELECT count(*) AS n FROM http_transfers WHERE scope = :s", {"s": scope})
    assert rows[0]["n"] == TRIALS  # one committed row per key
