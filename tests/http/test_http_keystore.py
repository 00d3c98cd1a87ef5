"""The HTTP middleware on a key store that shares no transaction with the application
(issue 2): plain handler endpoints work through the KeyStore protocol alone (and on
the Redis store itself, on a redis-server of the module's own), and an
endpoint that needs the store's transaction (request-as-transaction, a flow) is
refused when the configuration is built, with a message that says what to do."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from idempotence import AsyncSqliteStore, ConfigurationError, SqliteStore
from idempotence.flows import Flow
from idempotence.http import (
    Endpoint,
    Idempotency,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    Mode,
    Policy,
    single_tenant,
)
from tests.http import apps
from tests.http.clients import async_store, open_harness, sync_store
from tests.support.keystores import AsyncNoSharedTransactions, NoSharedTransactions

FIX = r"need a SQL store \(PostgresStore, SqliteStore"


@pytest.fixture
def key_store(sqlite_path: str) -> Any:
    store = NoSharedTransactions(SqliteStore(sqlite_path))
    yield store
    store.close()


# -- the refusal, at construction ---------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "mode"),
    [(Policy(transaction=True), "transaction"), (Policy(flow=Flow("keystore-f")), "flow")],
)
def test_an_endpoint_that_shares_the_transaction_is_refused(key_store, policy, mode):
    with pytest.raises(ConfigurationError, match=FIX) as refused:
        Idempotency(
            store=key_store,
            scope=single_tenant(),
            endpoints=[Endpoint("POST /plain"), Endpoint("POST /x", policy)],
        )
    message = str(refused.value)
    assert "Endpoint('POST /x')" in message and f"{mode} mode" in message
    assert "NoSharedTransactions" in message and "plain handler endpoints only" in message


@pytest.mark.parametrize(
    "default", [Policy(transaction=True), Policy(flow=Flow("keystore-default"))]
)
def test_a_default_policy_that_shares_the_transaction_is_refused(key_store, default):
    with pytest.raises(ConfigurationError, match="Idempotency.default .*" + FIX):
        Idempotency(store=key_store, scope=single_tenant(), default=default)


def test_the_same_endpoints_are_accepted_on_a_sql_store_or_left_unguarded(key_store, tmp_path):
    # Accepted, and kept as configured: the request-as-transaction endpoint, the flow
    # default and the unguarded endpoint resolve to what they were given.
    transaction, flow = Policy(transaction=True), Policy(flow=Flow("keystore-sql"))
    endpoints = [Endpoint("POST /x", transaction), Endpoint("POST /f", None)]
    sql = Idempotency(store=SqliteStore(":memory:"), scope=single_tenant(), endpoints=endpoints)
    assert sql.resolve("POST", "/x") == (transaction, {})
    assert sql.resolve("POST", "/f") is None
    flows = Idempotency(
        store=AsyncSqliteStore(str(tmp_path / "k.db")), scope=single_tenant(), default=flow
    )
    assert flows.resolve("POST", "/anything") == (flow, {})
    # Unguarded (policy None) and handler endpoints need no shared transaction.
    plain = Idempotency(
        store=key_store,
        scope=single_tenant(),
        endpoints=[Endpoint("POST /f", None), Endpoint("POST /h", Policy())],
    )
    assert plain.resolve("POST", "/f") is None
    resolved = plain.resolve("POST", "/h")
    assert resolved is not None and resolved[0].mode is Mode.HANDLER


def test_each_middleware_refuses_the_wrong_kind_of_key_store(key_store, sqlite_path):
    with pytest.raises(ConfigurationError, match="async store"):
        IdempotencyMiddleware(lambda *a: None, Idempotency(store=key_store, scope=single_tenant()))
    async_key_store = AsyncNoSharedTransactions(AsyncSqliteStore(sqlite_path))
    with pytest.raises(ConfigurationError, match="sync store"):
        IdempotencyWSGIMiddleware(
            lambda *a: [], Idempotency(store=async_key_store, scope=single_tenant())
        )


# -- plain handler endpoints, through the protocol ------------------------------------------

HANDLER_ONLY = [Endpoint("POST /exempt", None)]


@pytest.mark.parametrize("framework", apps.FRAMEWORKS)
def test_handler_endpoints_run_on_a_key_store(framework, backend, target, scope):
    def factory() -> Any:
        if framework in apps.ASGI:
            return AsyncNoSharedTransactions(async_store(backend, target))
        return NoSharedTransactions(sync_store(backend, target))

    with open_harness(
        framework, backend, target, scope, store_factory=factory, endpoints=HANDLER_ONLY
    ) as harness:
        check_handler_endpoints(harness)


@pytest.fixture(scope="module")
def redis_url() -> Any:
    from tests.support.redis import redis_server

    with redis_server() as server:
        yield server.url


@pytest.mark.parametrize("framework", apps.FRAMEWORKS)
def test_handler_endpoints_run_on_redis(framework, redis_url, scope):
    """The same, on the Redis store itself (sync for WSGI, async for ASGI)."""
    with open_harness(framework, "redis", redis_url, scope, endpoints=HANDLER_ONLY) as harness:
        check_handler_endpoints(harness)


def check_handler_endpoints(harness: Any) -> None:
    first = harness.post(key="k1")
    assert first.status == 201
    assert first.header("idempotent-replayed") is None
    again = harness.post(key="k1")
    assert again.status == 201 and again.body == first.body
    assert again.header("idempotent-replayed") == "true"
    assert harness.effects.counts["/charges"] == 1
    mismatch = harness.post(key="k1", body={"amount": 999})
    assert mismatch.status == 422
    assert harness.effects.counts["/charges"] == 1
    record = harness.record("k1")
    assert record is not None and record.response is not None

    # R5 through the protocol: a 4xx forgets the key, a 5xx releases it.
    assert harness.post("/reject", key="k2").status == 422
    assert harness.record("k2") is None
    assert harness.post("/unavailable", key="k3").status == 503
    assert harness.post("/unavailable", key="k3").status == 503
    assert harness.effects.counts["/unavailable"] == 2


@pytest.mark.parametrize("framework", ["starlette", "flask"])
def test_p10_redis_wakes_the_waiting_twin_by_pub_sub_not_by_its_next_poll(
    framework, redis_url, scope, monkeypatch
):
    """P10 on Redis: the finish script publishes on the store's channel, and the twin
    waiting in the middleware replays at once. Its polling pause is made as long as
    the whole wait, so polling alone would answer only after the 10 s."""
    from idempotence.flows import handler

    monkeypatch.setattr(handler, "FIRST_POLL", 60.0)
    monkeypatch.setattr(handler, "MAX_POLL", 60.0)
    with open_harness(
        framework,
        "redis",
        redis_url,
        scope,
        endpoints=HANDLER_ONLY,
        default_wait=timedelta(seconds=10),
    ) as harness:
        claim = harness.hold("p10-pubsub")
        finisher = threading.Timer(0.3, harness.finish_twin, (claim.lease,))
        started = time.monotonic()
        finisher.start()
        try:
            response = harness.post(key="p10-pubsub")
        finally:
            finisher.join()
        waited = time.monotonic() - started
    assert (response.status, response.body) == (201, b"from-twin")
    assert response.header("idempotent-replayed") == "true"
    assert harness.effects.total() == 0
    assert 0.3 <= waited < 5


@pytest.mark.parametrize("framework", ["starlette", "flask"])
def test_p11_a_closed_redis_store_is_503_and_runs_nothing(framework, redis_url, scope):
    with open_harness(framework, "redis", redis_url, scope, endpoints=HANDLER_ONLY) as harness:
        harness.break_store()
        response = harness.post(key="p11")
        assert response.status == 503
        assert response.problem["code"] == "idempotency_store_unavailable"
        assert harness.effects.total() == 0
