"""HTTP handler endpoints on the Redis store, through real servers (DESIGN 8, P6, P11).

* 32 identical POSTs at once, 50 times over, through uvicorn (async store) and
  waitress (sync store): each key runs once, the rest get 409 or the replay;
* a server SIGKILLed mid-handler: the retry takes the key over after the lock
  timeout, and a live handler slower than its lock is never taken over (F2) -- the
  crash tests of tests/http/test_http_crash.py, run on Redis;
* Redis itself killed (no persistence) and restarted mid-run: 503 while it is down,
  with nothing run (a request whose handler ran gets 503 too: its answer could not be
  stored); no 5xx once it is back; and the keys it lost, in flight or finished, are new
  keys to it: a retry executes again (the README says so).

Every Redis here is a ``redis-server`` of the test's own (tests/support/redis.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from idempotence.http import Idempotency, IdempotencyMiddleware, Policy, single_tenant
from idempotence.stores.redis import AsyncRedisStore, RedisStore
from tests.http import apps
from tests.http import test_http_crash as crash
from tests.http.servers import uvicorn_server, waitress_server
from tests.http.test_http_servers import race_trials, racers_at
from tests.support.redis import RedisServer, redis_server

#: The slow tier: real servers on Redis, Redis restarted mid-run.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


HANDLER_ENDPOINTS: list[Any] = []  # every endpoint on the default (handler) policy


@contextlib.contextmanager
def running(server: str, url: str) -> Iterator[tuple[str, apps.Effects]]:
    effects = apps.Effects("redis")
    if server == "uvicorn":
        store = AsyncRedisStore(url)

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            yield
            await store.close()

        config = apps.make_config(store, endpoints=HANDLER_ENDPOINTS)
        with uvicorn_server(apps.starlette_app(effects, config, lifespan=lifespan)) as base:
            yield base, effects
    else:
        with RedisStore(url) as sync_store:
            config = apps.make_config(sync_store, endpoints=HANDLER_ENDPOINTS)
            with waitress_server(apps.flask_app(effects, config)) as base:
                yield base, effects


@pytest.mark.slow
@pytest.mark.parametrize("server", ["uvicorn", "waitress"])
def test_p6_concurrent_identical_posts_execute_once_on_redis(
    server: str, own_redis: RedisServer, scope: str
) -> None:
    with running(server, own_redis.url) as (url, effects), racers_at(url, scope) as racers:
        race_trials(racers, effects)


# -- a server killed mid-handler (F2, P5), as on the SQL stores ------------------------------


@pytest.mark.parametrize("server", ["uvicorn", "waitress"])
@crash.HANDLER_CRASH_TESTS
def test_f2_crash_and_retry_on_redis(
    server: str, crash_test: Any, own_redis: RedisServer, tmp_path: Path
) -> None:
    crash_test(server, "redis", own_redis.url, tmp_path)


# -- Redis killed and restarted mid-run (P11) -------------------------------------------------


class GatedApp:
    """An ASGI app whose handler counts its executions by key, and blocks while
    ``gate`` is shut (a request in flight across the outage)."""

    def __init__(self) -> None:
        self.executions: dict[str, int] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        key = dict(scope["headers"]).get(b"idempotency-key", b"").decode()
        self.executions[key] = self.executions.get(key, 0) + 1
        self.entered.set()
        await asyncio.to_thread(self.gate.wait, 30)
        body = f'{{"key": "{key}", "n": {self.executions[key]}}}'.encode()
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-n", b"1")]})
        await send({"type": "http.response.body", "body": body})


def test_p11_redis_restarted_mid_run_503_while_down_and_lost_keys_run_again() -> None:
    app = GatedApp()
    with redis_server() as redis_srv:
        store = AsyncRedisStore(redis_srv.url, timeout=0.5)
        config = Idempotency(
            store=store,
            scope=single_tenant("restart"),
            default=Policy(lock_timeout=timedelta(seconds=2)),
        )
        with uvicorn_server(IdempotencyMiddleware(app, config)) as url:
            client = httpx.Client(base_url=url, timeout=10)

            def post(key: str) -> httpx.Response:
                return client.post("/pay", json={"a": 1}, headers={"idempotency-key": key})

            before = [post(f"before-{n}") for n in range(10)]
            assert {r.status_code for r in before} == {201}
            assert post("before-0").headers["idempotent-replayed"] == "true"

            # A request in flight when Redis dies: its handler is running.
            app.gate.clear()
            app.entered.clear()
            in_flight: list[httpx.Response] = []
            thread = threading.Thread(target=lambda: in_flight.append(post("in-flight")))
            thread.start()
            assert app.entered.wait(10)

            redis_srv.stop()  # SIGKILL; nothing is persisted
            executed = sum(app.executions.values())
            for n in range(5):
                started = time.monotonic()
                down = post(f"down-{n}")
                assert down.status_code == 503, down.text
                assert int(down.headers["retry-after"]) >= 1
                assert time.monotonic() - started < 3  # fail closed, quickly
            assert post("before-1").status_code == 503  # not even a replay
            assert sum(app.executions.values()) == executed  # nothing ran

            app.gate.set()  # the in-flight handler ends while Redis is down
            thread.join(timeout=20)
            # It ran, but the store could not record its answer: not sent (a retry
            # could get another), 503, and stored again in the background, which the
            # empty Redis will refuse (the key is gone).
            assert [r.status_code for r in in_flight] == [503]
            assert b"was processed" in in_flight[0].content

            redis_srv.start()  # back, empty
            after = [post(f"after-{n}") for n in range(20)]
            assert [r.status_code for r in after] == [201] * 20  # no 5xx once it is back
            # What the restart lost is a new key to it: the retry executes again.
            again = post("in-flight")
            assert again.status_code == 201 and "idempotent-replayed" not in again.headers
            assert app.executions["in-flight"] == 2
            lost = post("before-0")
            assert lost.status_code == 201 and "idempotent-replayed" not in lost.headers
            assert app.executions["before-0"] == 2
            assert post("before-0").headers["idempotent-replayed"] == "true"
            client.close()


def test_p11_the_sync_store_fails_closed_through_waitress_too() -> None:
    app_effects = apps.Effects("redis")
    with redis_server() as redis_srv, RedisStore(redis_srv.url, timeout=0.5) as store:
        config = apps.make_config(store, endpoints=HANDLER_ENDPOINTS)
        with waitress_server(apps.flask_app(app_effects, config)) as url:
            headers = {"idempotency-key": "", apps.TENANT_HEADER: uuid.uuid4().hex}

            def post(key: str) -> httpx.Response:
                headers["idempotency-key"] = key
                return httpx.post(url + "/charges", json={"amount": 1}, headers=headers)

            assert post("a").status_code == 201
            redis_srv.stop()
            assert post("b").status_code == 503
            assert app_effects.counts["/charges"] == 1
            redis_srv.start()
            assert post("c").status_code == 201
            assert post("c").headers["idempotent-replayed"] == "true"
