"""The HTTP middleware on an AsyncCachedStore, through a real uvicorn (DESIGN 8: Cached).

A cached store stands in for its SQL primary: handler, request-as-transaction and
flow endpoints all run on it, and a replay is served from Redis. With Redis killed in
the middle of a run (a redis-server of the test's own), every request is still
answered, rightly, by the primary: no 5xx, no second execution.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from idempotence.stores.cached import AsyncCachedStore
from tests.http import apps
from tests.http import test_http_crash as crash
from tests.http.clients import async_store
from tests.http.servers import uvicorn_server
from tests.http.test_http_servers import race_trials, racers_at
from tests.support.redis import redis_server

#: The slow tier: real servers on the cached store.
pytestmark = pytest.mark.slow

BACKENDS = ["postgres", "sqlite"]


@contextmanager
def serve(backend: str, target: str, redis: str, prefix: str) -> Iterator[tuple[str, Any, Any]]:
    """uvicorn serving the suites' Starlette app on a cached store; yields its URL,
    the store and the app's effects. The store closes with the app's lifespan."""
    store = AsyncCachedStore(async_store(backend, target), redis, prefix=prefix, pause=0.2)
    effects = apps.Effects(backend)
    apps.FLOW_EFFECTS.append(effects)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await store.close()

    app = apps.starlette_app(effects, apps.make_config(store), lifespan=lifespan)
    with uvicorn_server(app) as url:
        yield url, store, effects


def post(
    client: httpx.Client, path: str, key: str, tenant: str, body: Any = None
) -> httpx.Response:
    return client.post(
        path,
        content=json.dumps(body if body is not None else {"amount": 5}),
        headers={
            "content-type": "application/json",
            "idempotency-key": key,
            apps.TENANT_HEADER: tenant,
        },
    )


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(backend: str, request: pytest.FixtureRequest) -> str:
    return str(
        request.getfixturevalue("pg_http_url" if backend == "postgres" else "sqlite_http_path")
    )


def test_every_kind_of_endpoint_runs_on_a_cached_store_and_replays_from_redis(
    backend: str, target: str, redis_url: str, redis_prefix: str, scope: str
) -> None:
    with serve(backend, target, redis_url, redis_prefix) as (url, store, effects):
        with httpx.Client(base_url=url, timeout=10) as client:
            for path in ("/charges", "/tx/one", "/rides"):
                first = post(client, path, f"key-{path}", scope)
                assert first.status_code == 201, first.text
                assert "idempotent-replayed" not in first.headers
                for _ in range(2):
                    again = post(client, path, f"key-{path}", scope)
                    assert again.status_code == 201 and again.content == first.content
                    assert again.headers["idempotent-replayed"] == "true"
                mismatch = post(client, path, f"key-{path}", scope, {"amount": 999})
                assert mismatch.status_code == 422
        assert effects.counts["/charges"] == 1 and effects.counts["/tx/one"] == 1
        assert effects.counts["/rides:finished"] == 1
        # The handler's finish was written through: both its retries came from Redis;
        # the transaction's and the flow's finishes are cached by their first replay,
        # so their second retry came from Redis.
        assert store.cache_stats.hits == 2 + 1 + 1


def test_redis_killed_mid_run_answers_every_request_from_the_primary(
    backend: str, target: str, redis_prefix: str, scope: str, tmp_path: Path
) -> None:
    with redis_server() as server, serve(backend, target, server.url, "http") as running:
        url, store, effects = running
        answers: dict[str, bytes] = {}
        failures: list[str] = []
        lock = threading.Lock()

        def client_loop(worker: int, rounds: range) -> None:
            with httpx.Client(base_url=url, timeout=10) as client:
                for i in rounds:
                    key = f"w{worker}-{i}"
                    for attempt in range(3):  # the first request and two retries
                        got = post(client, "/charges", key, scope)
                        with lock:
                            if got.status_code != 201:
                                failures.append(f"{key}#{attempt}: {got.status_code}")
                            elif answers.setdefault(key, got.content) != got.content:
                                failures.append(f"{key}#{attempt}: another answer")

        def run(rounds: range) -> None:
            threads = [threading.Thread(target=client_loop, args=(w, rounds)) for w in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

        run(range(10))
        hits_before = store.cache_stats.hits
        assert hits_before > 0
        server.stop()
        run(range(10, 25))
        assert failures == []
        assert effects.counts["/charges"] == 4 * 25  # each key ran once, down or not
        assert store.cache_stats.errors >= 1  # the degradation is counted
        # ... and every retry before the kill was a replay, from Redis.
        assert hits_before == 4 * 10 * 2


@pytest.mark.slow
def test_p6_concurrent_identical_posts_execute_once_on_a_cached_store(
    backend: str, target: str, scope: str
) -> None:
    # The race of the SQL stores' suite, through the cache: the first request's
    # finish fills it while its twins claim, and none of them may run the work again.
    with (
        redis_server() as redis,
        serve(backend, target, redis.url, "race") as (url, _, effects),
        racers_at(url, scope) as racers,
    ):
        race_trials(racers, effects)


@pytest.mark.parametrize("server", ["uvicorn", "waitress"])
@crash.HANDLER_CRASH_TESTS
def test_f2_crash_and_retry_through_the_cache(
    server: str, crash_test: Any, backend: str, target: str, tmp_path: Path
) -> None:
    # The SQL stores' crash tests of plain handlers, each server process with a cached
    # store of its own on one primary and one Redis: the heartbeat and the takeover
    # go through the cached store to the primary.
    with redis_server() as redis:
        crash_test(server, f"cached-{backend}", f"{target}|{redis.url}", tmp_path)
