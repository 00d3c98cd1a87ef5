"""A key's status URL (``Idempotency(key_status_path=...)``), on every framework (ASGI
and WSGI, through each one's real app and test client) and both SQL stores: 200 with the
key's state, 404 for a key the tenant does not hold, 410 once its retention has passed
(before the reaper deleted it), hostile URLs refused with 400; off unless turned on.
The replay of a finished key past its retention is the design's decision (B3): it still
replays until the reaper deletes the key, then the key runs as a new request."""

from __future__ import annotations

import urllib.parse
import warnings
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import pytest

from idempotence.errors import ConfigurationError
from idempotence.http import (
    Endpoint,
    Idempotency,
    KeyScope,
    Policy,
    header_scope,
    single_tenant,
)
from idempotence.maintenance import Reaper, ReaperConfig
from tests.http import apps
from tests.http.clients import Resp
from tests.support.clock import age_key

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Starlette's notice about httpx vs httpx2
    from starlette.testclient import TestClient

STATUS = "/idempotence/keys"
QUERY = "idempotency_status_query_invalid"
PAST_RETENTION = timedelta(hours=25)  # the default retention is 24 hours


def status(harness, key: str, query: str = "", **kwargs) -> Resp:
    path = f"{STATUS}/{urllib.parse.quote(key, safe='')}"
    return harness.get(path + (f"?{query}" if query else ""), **kwargs)


def problem_code(response: Resp) -> str:
    assert response.header("content-type") == "application/problem+json"
    return str(response.json()["code"])


def test_the_status_url_is_off_unless_turned_on(harness):
    harness.post("/charges", key="k-off")
    response = status(harness, "k-off")
    # Nothing intercepts it: the app's own catch-all route answers.
    assert response.status == 201 and response.json()["path"] == f"{STATUS}/k-off"
    assert harness.effects.counts[f"{STATUS}/k-off"] == 1


def test_200_with_the_state_of_a_key_and_404_for_an_unknown_one(make_harness):
    with make_harness(key_status_path=STATUS) as harness:
        sent = harness.post("/charges", key="k-1")
        assert sent.status == 201
        found = status(harness, "k-1")
        assert found.status == 200
        assert found.header("content-type") == "application/json"
        assert found.header("cache-control") == "no-store"
        body = found.json()
        assert body["idempotency_key"] == "k-1"
        assert (body["state"], body["response_status"]) == ("complete", 201)
        record = harness.record("k-1")
        assert body["expires_at"] == record.expires_at.isoformat(timespec="milliseconds").replace(
            "+00:00", "Z"
        )
        assert body["created_at"] <= body["finished_at"] < body["expires_at"]
        assert "body" not in body and "headers" not in body  # never the stored response
        # A key in progress, and a stored failure.
        harness.hold("k-running")
        assert status(harness, "k-running").json()["state"] == "processing"
        harness.post("/declined", key="k-declined")
        declined = status(harness, "k-declined").json()
        assert (declined["state"], declined["response_status"]) == ("failed", 402)
        # Unknown, and unknown to another tenant: no tenant sees another's keys.
        unknown = status(harness, "never-sent")
        assert unknown.status == 404 and problem_code(unknown) == "idempotency_key_unknown"
        assert "never-sent" in unknown.json()["detail"]
        elsewhere = status(harness, "k-1", tenant=harness.tenant + "-other")
        assert elsewhere.status == 404
        assert status(harness, "k-1", tenant="").status == 401
        # Reading a status is no request of the app's, and changes nothing.
        assert harness.effects.counts["/charges"] == 1
        assert harness.post("/charges", key="k-1").header("idempotent-replayed") == "true"


def test_410_once_the_retention_passed_before_the_reaper_and_the_replay_until_then(make_harness):
    with make_harness(key_status_path=STATUS) as harness:
        first = harness.post("/charges", key="k-old")
        age_key(harness.inspect, harness.tenant, "k-old", PAST_RETENTION)
        assert harness.record("k-old") is not None  # not reaped: still in the table
        gone = status(harness, "k-old")
        assert gone.status == 410 and problem_code(gone) == "idempotency_key_expired"
        assert "past its retention" in gone.json()["detail"]
        # The decision: until the reaper deletes it, a retry replays the stored answer,
        # and another request with the key is still refused.
        retry = harness.post("/charges", key="k-old")
        assert retry.status == 201 and retry.body == first.body
        assert retry.header("idempotent-replayed") == "true"
        assert harness.post("/charges", {"amount": 5}, key="k-old").status == 422
        assert harness.effects.counts["/charges"] == 1
        # Once deleted, the key is forgotten: 404, and a request with it is new.
        assert Reaper(harness.inspect, ReaperConfig(batch_pause=0.0)).run_once().deleted >= 1
        assert status(harness, "k-old").status == 404
        again = harness.post("/charges", key="k-old")
        assert again.status == 201 and again.header("idempotent-replayed") is None
        assert harness.effects.counts["/charges"] == 2
        assert status(harness, "k-old").json()["state"] == "complete"


def test_an_errored_key_past_its_retention_stays_errored_for_a_human(make_harness):
    with make_harness(key_status_path=STATUS) as harness:
        claim = harness.hold("k-errored")
        harness.inspect.finish(claim.lease, _stored(502), error="timeout")
        age_key(harness.inspect, harness.tenant, "k-errored", PAST_RETENTION)
        errored = status(harness, "k-errored")
        assert errored.status == 200 and errored.json()["state"] == "errored"


def test_a_key_of_an_endpoint_that_keeps_its_own_keys_is_named_with_it(make_harness):
    with make_harness(key_status_path=STATUS, default_key_scope=KeyScope.ENDPOINT) as harness:
        harness.post("/charges/a%20b", key="k-ep")
        bare = status(harness, "k-ep")
        assert bare.status == 404 and "?method=POST&path=" in bare.json()["detail"]
        query = urllib.parse.urlencode({"method": "post", "path": "/charges/a b"})
        named = status(harness, "k-ep", query)
        assert named.status == 200 and named.json()["state"] == "complete"
        other = urllib.parse.urlencode({"method": "POST", "path": "/refunds"})
        assert status(harness, "k-ep", other).status == 404
        # Another field (a cache-buster) is not ours, and changes nothing.
        assert status(harness, "k-ep", query + "&t=1").status == 200


@pytest.mark.parametrize(
    ("url", "code", "says"),
    [
        (f"{STATUS}/" + "k" * 256, "idempotency_key_invalid", "too long: 256 characters"),
        (f"{STATUS}/%00", "idempotency_key_invalid", "U+0000"),
        (f"{STATUS}/%C3%A9t%C3%A9", "idempotency_key_invalid", "not printable ASCII"),
        (f"{STATUS}/", "idempotency_key_invalid", "empty"),
        (f"{STATUS}/k?method=POST", QUERY, "both method= and path="),
        (f"{STATUS}/k?method=GET&path=/x", QUERY, "never guarded"),
        (f"{STATUS}/k?method=P%20ST&path=/x", QUERY, "not an HTTP"),
        (f"{STATUS}/k?method=POST&path=x", QUERY, "starting with"),
        (f"{STATUS}/k?method=POST&path=/exempt", QUERY, "not guarded"),
        (f"{STATUS}/k?method=POST&method=PATCH&path=/x", QUERY, "twice"),
        (f"{STATUS}/k?method=POST&path=%FF", QUERY, "UTF-8"),
        (f"{STATUS}/k?" + "&".join(f"f{n}=1" for n in range(50)), QUERY, "at most"),
    ],
)  # fmt: skip
def test_hostile_status_urls_answer_400_saying_what_to_fix(make_harness, url, code, says):
    with make_harness(key_status_path=STATUS) as harness:
        response = harness.get(url)
        assert response.status == 400, response.body
        assert problem_code(response) == code
        assert says in response.json()["detail"]
        assert harness.effects.total() == 0


def test_a_key_with_reserved_characters_is_read_percent_encoded(make_harness):
    with make_harness(key_status_path=STATUS) as harness:
        key = "order/1?x=1 & 2#f"
        harness.post("/charges", key=key)
        assert harness.config.key_status_url(key) == f"{STATUS}/order%2F1%3Fx%3D1%20%26%202%23f"
        response = harness.get(harness.config.key_status_url(key))
        assert response.status == 200 and response.json()["idempotency_key"] == key


def test_an_unreachable_store_answers_503(make_harness):
    with make_harness(key_status_path=STATUS) as harness:
        harness.break_store()
        down = status(harness, "k")
        assert down.status == 503 and problem_code(down) == "idempotency_store_unavailable"
        assert down.header("retry-after") == "5"


def test_the_path_is_checked_when_built():
    with pytest.raises(ConfigurationError, match=r"key_status_path='keys'.*start and not end"):
        Idempotency(store=object(), scope=single_tenant(), key_status_path="keys")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="a path of its own"):
        Idempotency(
            store=object(),  # type: ignore[arg-type]
            scope=single_tenant(),
            key_status_path="/idempotence/operations",
        )
    off = Idempotency(store=object(), scope=single_tenant())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="key_status_path"):
        off.key_status_url("k")
    unguarded = Idempotency(
        store=object(),  # type: ignore[arg-type]
        scope=single_tenant(),
        key_status_path=STATUS,
        endpoints=[Endpoint("/v1/webhooks", None)],
        default=Policy(),
    )
    assert unguarded.resolve("GET", f"{STATUS}/k") == (unguarded.key_status_policy, {"key": "k"})
    assert unguarded.resolve("POST", f"{STATUS}/k") is not None  # a POST there is a request
    assert unguarded.resolve("GET", f"{STATUS}x/k") is None


def test_litestar_routes_the_status_url_to_the_middleware(sqlite_path, scope):
    from litestar import Litestar, post
    from litestar.testing import TestClient

    from idempotence import AsyncSqliteStore
    from idempotence.contrib.litestar import idempotency_middleware, status_routes
    from idempotence.http import header_scope

    @post("/orders")
    async def orders() -> dict[str, int]:
        return {"order": 1}

    config = Idempotency(
        store=AsyncSqliteStore(sqlite_path),
        scope=header_scope("x-tenant"),
        key_status_path=STATUS,
    )
    tenant = {"x-tenant": scope}
    middleware = [idempotency_middleware(config)]
    # Litestar routes before its middleware runs: without a route, its own 404.
    with TestClient(Litestar(route_handlers=[orders], middleware=middleware)) as bare:
        assert bare.get(f"{STATUS}/k", headers=tenant).json()["status_code"] == 404
    routes = [orders, *status_routes(config)]
    with TestClient(Litestar(route_handlers=routes, middleware=middleware)) as client:
        client.post("/orders", json={}, headers={**tenant, "idempotency-key": "k/1"})
        found = client.get(config.key_status_url("k/1"), headers=tenant)
        assert found.status_code == 200 and found.json()["state"] == "complete"
        assert client.get(f"{STATUS}/nope", headers=tenant).json()["code"] == (
            "idempotency_key_unknown"
        )
        client.blocking_portal.call(config.store.close)  # type: ignore[union-attr]


def _stored(status_code: int):
    from idempotence import StoredResponse

    return StoredResponse.of(status_code, {"content-type": "text/plain"}, b"?")


@pytest.mark.parametrize("framework", ["fastapi", "flask"])
def test_the_status_url_on_a_redis_key_store(framework, redis_url, redis_prefix, scope):
    # A key store without SQL answers through the same route: 200, 404, and 410 for a
    # record past its expiry that Redis has not dropped yet (aged, its TTL untouched).
    from idempotence.stores.redis import AsyncRedisStore, RedisStore
    from tests.http.clients import FlaskClient, HttpxClient

    asgi = framework == "fastapi"
    store = (AsyncRedisStore if asgi else RedisStore)(redis_url, prefix=redis_prefix)
    config = Idempotency(
        store=store,
        scope=header_scope(apps.TENANT_HEADER),
        key_status_path=STATUS,
        endpoints=[],
    )
    effects = apps.Effects("redis")
    inspect = RedisStore(redis_url, prefix=redis_prefix)
    with ExitStack() as stack:
        stack.callback(inspect.close)
        if asgi:
            raw = stack.enter_context(TestClient(apps.fastapi_app(effects, config)))
            stack.callback(lambda: raw.portal.call(store.close))
            client: Any = HttpxClient(raw)
        else:
            stack.callback(store.close)
            client = FlaskClient(apps.flask_app(effects, config).test_client())
        tenant = (apps.TENANT_HEADER, scope)
        key = ("idempotency-key", "k-redis")
        first = client.request("POST", "/charges", b"{}", [tenant, key])
        assert first.status == 201
        found = client.request("GET", f"{STATUS}/k-redis", b"", [tenant])
        assert found.status == 200 and found.json()["state"] == "complete"
        assert client.request("GET", f"{STATUS}/nope", b"", [tenant]).status == 404
        age_key(inspect, scope, "k-redis", PAST_RETENTION)
        gone = client.request("GET", f"{STATUS}/k-redis", b"", [tenant])
        assert gone.status == 410 and problem_code(gone) == "idempotency_key_expired"
        again = client.request("POST", "/charges", b"{}", [tenant, key])
        assert again.body == first.body and again.header("idempotent-replayed") == "true"
        assert effects.counts["/charges"] == 1
