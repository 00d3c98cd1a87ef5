"""The sans-I/O core and the configuration, without a database or a framework."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest

from idempotence import AsyncSqliteStore, ConfigurationError, SqliteStore, StoredResponse
from idempotence.errors import InvalidBody, InvalidKey, MissingKey
from idempotence.flows import Flow, HandlerStep, Settle
from idempotence.http import (
    Endpoint,
    Idempotency,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    Mode,
    Policy,
    Problem,
    Profile,
    RequestInfo,
    current_async_transaction,
    current_lease,
    current_transaction,
    header_scope,
    single_tenant,
)
from idempotence.http._effects import Capture, Captured
from idempotence.http._problems import render
from idempotence.http._request import RepeatedKey, flow_params, read_key
from idempotence.http._responses import finalize
from idempotence.http.wsgi import environ_headers, wsgi_path


@pytest.fixture
def store() -> SqliteStore:
    return SqliteStore(":memory:")


# -- configuration ----------------------------------------------------------------------


def test_scope_is_mandatory_and_says_how_to_opt_into_one_tenant(store):
    with pytest.raises(ConfigurationError, match="single_tenant"):
        Idempotency(store=store)
    config = Idempotency(store=store, scope=single_tenant("shop"))
    assert config.scope(RequestInfo("POST", "/")) == "shop"
    with pytest.raises(ConfigurationError):
        single_tenant("")


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"methods": ("GET",)}, "methods"),
        ({"methods": ()}, "methods"),
        ({"lock_timeout": timedelta(0)}, "lock_timeout"),
        ({"retention": timedelta(seconds=-1)}, "retention"),
        ({"max_body_bytes": -1}, "max_body_bytes"),
        ({"rejected_statuses": {500}}, "rejected_statuses"),
        ({"replay_headers": ("content-length",)}, "replay_headers"),
        ({"replay_headers": "x-trace"}, "replay_headers"),
        ({"exclude_fields": "meta"}, "exclude_fields"),
        ({"wait": timedelta(hours=1)}, "wait"),
        ({"transaction": True, "flow": Flow("f")}, "flow"),
        ({"fail_open": True, "transaction": True}, "fail_open"),
        ({"flow_params": lambda r, b: b}, "flow_params"),
        # A flow's keys follow the flow's own settings (the completer resumes them).
        ({"flow": Flow("f"), "lock_timeout": timedelta(seconds=5)}, "lock_timeout"),
        ({"flow": Flow("f"), "retention": None}, "retention"),
        ({"flow": Flow("f"), "store_server_errors": True}, "store_server_errors"),
        ({"in_progress_retry_after": 0}, "in_progress_retry_after"),
        ({"heartbeat": timedelta(0)}, "heartbeat"),
        ({"heartbeat": timedelta(seconds=10)}, "heartbeat"),  # not under the lock timeout
        ({"heartbeat": timedelta(seconds=1), "transaction": True}, "heartbeat"),
        ({"heartbeat": timedelta(seconds=1), "flow": Flow("f")}, "heartbeat"),
    ],
)
def test_policy_validation_names_the_setting(settings, names):
    with pytest.raises(ConfigurationError, match=f"Policy.{names}="):
        Policy(**settings)


def test_policy_defaults():
    policy = Policy()
    assert policy.methods == {"POST", "PATCH"}
    assert policy.key_required and not policy.fail_open and not policy.store_server_errors
    assert policy.mode is Mode.HANDLER
    assert {400, 422, 429} <= policy.rejected_statuses and 402 not in policy.rejected_statuses
    assert policy.stored_headers == {"content-type", "content-encoding", "location"}
    assert Policy(replay_headers=("X-Trace",)).stored_headers >= {"x-trace"}
    assert Policy(flow=Flow("f")).mode is Mode.FLOW


def test_endpoints_match_by_method_and_pattern(store):
    tx = Policy(transaction=True)
    config = Idempotency(
        store=store,
        scope=single_tenant(),
        endpoints=[
            Endpoint("POST /v1/rides/{ride}/charge", tx),
            Endpoint("/v1/webhooks/{rest:path}", None),
            Endpoint("PUT /v1/files/{name}"),
        ],
    )
    assert config.resolve("POST", "/v1/rides/r_1/charge") == (tx, {"ride": "r_1"})
    assert config.resolve("POST", "/v1/rides/r_1/x/charge")[0] is config.default  # one segment
    assert config.resolve("POST", "/v1/webhooks/stripe/events") is None
    assert config.resolve("PUT", "/v1/files/a.txt")[1] == {"name": "a.txt"}
    assert config.resolve("PUT", "/v1/other") is None  # PUT is not a default method (P9)
    assert config.resolve("GET", "/v1/rides/r_1/charge") is None
    assert config.resolve("PATCH", "/anything")[0] is config.default
    assert (
        Idempotency(store=store, scope=single_tenant(), default=None).resolve("POST", "/") is None
    )


def test_a_remembered_resolution_answers_as_the_first_and_hands_out_its_own_params(store):
    config = Idempotency(
        store=store, scope=single_tenant(), endpoints=[Endpoint("POST /v1/rides/{ride}")]
    )
    first = config.resolve("POST", "/v1/rides/r_1")
    first[1]["ride"] = "changed by a scope callable"  # RequestInfo.path_params is the caller's
    again = config.resolve("POST", "/v1/rides/r_1")
    assert again == (config.endpoints[0].policy, {"ride": "r_1"})
    assert config.resolve("GET", "/v1/rides/r_1") is None
    assert config.resolve("GET", "/v1/rides/r_1") is None  # a remembered None too


@pytest.mark.parametrize("route", ["POST", "POST /a /b", "GET /a", "POST a"])
def test_bad_endpoint_routes_are_refused(route):
    with pytest.raises(ConfigurationError):
        Endpoint(route)


def test_each_middleware_refuses_the_wrong_kind_of_store(store, tmp_path):
    with pytest.raises(ConfigurationError, match="async store"):
        IdempotencyMiddleware(lambda *a: None, Idempotency(store=store, scope=single_tenant()))
    async_store = AsyncSqliteStore(str(tmp_path / "k.db"))
    with pytest.raises(ConfigurationError, match="sync store"):
        IdempotencyWSGIMiddleware(
            lambda *a: [], Idempotency(store=async_store, scope=single_tenant())
        )


def test_header_scope_reads_the_header():
    scope = header_scope("X-Account")
    assert scope(RequestInfo("POST", "/", headers=(("x-account", "a1"),))) == "a1"
    assert scope(RequestInfo("POST", "/")) is None


# -- the key header (P7, P8) --------------------------------------------------------------


def test_read_key():
    assert read_key(['"abc"'], required=True) == "abc"
    assert read_key(["abc"], required=True) == "abc"
    assert read_key(['"a,b"'], required=True) == "a,b"  # a comma inside quotes is fine
    assert read_key([], required=False) is None
    with pytest.raises(MissingKey):
        read_key([], required=True)
    with pytest.raises(RepeatedKey):
        read_key(["a", "b"], required=True)
    with pytest.raises(RepeatedKey):
        read_key(["a, b"], required=True)  # what a WSGI server makes of two fields
    with pytest.raises(InvalidKey):
        read_key(['"a", "b"'], required=True)


# -- responses ------------------------------------------------------------------------------


def handler_step(policy: Policy) -> HandlerStep:
    """The engine's handler step that ``policy`` configures (F6)."""
    assert policy.engine is not None
    step = policy.engine.steps["started"]
    assert isinstance(step, HandlerStep)
    return step


def settle(policy: Policy, status: int) -> Settle:
    return handler_step(policy).settle(status, policy.store_server_errors)


def test_settle_follows_r5():
    policy = Policy()
    assert settle(policy, 200) is Settle.STORE
    assert settle(policy, 402) is Settle.STORE
    assert settle(policy, 409) is Settle.STORE
    assert settle(policy, 404) is Settle.FORGET
    assert settle(policy, 422) is Settle.FORGET
    assert settle(policy, 500) is Settle.RELEASE
    assert settle(Policy(store_server_errors=True), 503) is Settle.STORE
    assert settle(Policy(rejected_statuses=frozenset()), 422) is Settle.STORE


def test_f6_a_policy_configures_its_engine_run_in_one_place():
    policy = Policy(
        lock_timeout=timedelta(seconds=5),
        retention=None,
        store_server_errors=True,
        transaction=True,
        max_response_bytes=10,
    )
    engine = policy.engine
    assert engine is not None and engine.name == "http"
    assert (engine.lock_timeout, engine.retention) == (timedelta(seconds=5), None)
    assert engine.store_server_errors and engine.request_as_transaction
    assert handler_step(policy).limit == 10
    assert Policy(flow=Flow("f")).engine is None  # a flow endpoint runs its flow


def test_f2_a_plain_endpoint_has_a_short_lock_kept_alive_by_heartbeats():
    policy = Policy()
    assert policy.lock_timeout == timedelta(seconds=10)  # a crashed key is free in 10 s
    assert policy.engine is not None and policy.engine.lock_timeout == policy.lock_timeout
    assert handler_step(policy).beat_every(policy.lock_timeout) == pytest.approx(10 / 3)
    beating = Policy(lock_timeout=timedelta(seconds=4), heartbeat=timedelta(seconds=1))
    assert handler_step(beating).beat_every(beating.lock_timeout) == 1.0
    assert Flow("f").lock_timeout == timedelta(seconds=60)  # a flow keeps its own


def test_capture_buffers_up_to_the_limit():
    capture = Capture(limit=5)
    capture.start(200, [("Content-Type", "text/plain")])
    assert capture.add(b"abc") is False
    assert capture.add(b"def") is True  # crossed the limit now
    assert capture.add(b"ghi") is False  # and only once
    assert capture.result().overflowed
    with pytest.raises(RuntimeError, match="without starting"):
        Capture(1).result()


def test_storable_keeps_allowed_headers_only():
    captured = Captured(
        201,
        (("Content-Type", "a/b"), ("Set-Cookie", "s=1"), ("Location", "/x"), ("X-Other", "1")),
        b"{}",
    )
    stored = handler_step(Policy()).stored(captured)
    assert stored.headers == (("content-type", "a/b"), ("location", "/x"))
    with_cookie = handler_step(Policy(replay_headers=("set-cookie",))).stored(captured)
    assert ("set-cookie", "s=1") in with_cookie.headers  # only when asked for


def test_finalize_adds_length_and_replay_mark():
    response = finalize(StoredResponse.of(201, {"content-type": "a/b"}, b"abc"), replayed=True)
    assert dict(response.headers) == {
        "content-type": "a/b",
        "idempotent-replayed": "true",
        "content-length": "3",
    }
    assert "content-length" not in dict(finalize(StoredResponse.of(204)).headers)


@pytest.mark.parametrize("problem", list(Problem))
def test_every_problem_renders_in_both_profiles(problem):
    ietf = render(Profile.IETF, problem, "What to fix.")
    body = json.loads(ietf.body)
    assert body["code"] == problem.code and body["status"] == ietf.status
    assert dict(ietf.headers)["content-type"] == "application/problem+json"
    stripe = render(Profile.STRIPE, problem, "What to fix.")
    assert json.loads(stripe.body)["error"]["code"] == problem.code
    assert dict(stripe.headers)["content-type"] == "application/json"
    expected = 400 if problem is Problem.KEY_REUSED else problem.status
    assert stripe.status == expected


def test_flow_params_from_json_and_forms():
    def info(content_type: str) -> RequestInfo:
        return RequestInfo("POST", "/", headers=(("content-type", content_type),))

    assert flow_params(info("application/json"), b'{"a": 1}') == {"a": 1}
    form = flow_params(info("application/x-www-form-urlencoded"), b"a=1&b=2&a=3")
    assert form == {"a": ["1", "3"], "b": "2"}
    assert flow_params(info("text/plain"), b"") == {}
    with pytest.raises(InvalidBody) as raised:
        flow_params(info("text/plain"), b"hello")
    assert raised.value.status == 415


# -- WSGI details ---------------------------------------------------------------------------


def test_environ_headers_and_path():
    environ = {
        "HTTP_IDEMPOTENCY_KEY": "k",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": "",
        "PATH_INFO": "/caf\xc3\xa9",
    }
    assert dict(environ_headers(environ)) == {
        "idempotency-key": "k",
        "content-type": "application/json",
    }
    assert wsgi_path(environ) == "/café"


# -- context -----------------------------------------------------------------------------------


def test_context_accessors_outside_a_request_say_where_they_work():
    with pytest.raises(ConfigurationError, match="transaction=True"):
        current_transaction()
    with pytest.raises(ConfigurationError, match="transaction=True"):
        current_async_transaction()
    with pytest.raises(ConfigurationError, match="guarded"):
        current_lease()


# -- ASGI details ---------------------------------------------------------------------------------


def test_asgi_passes_other_scopes_and_unguarded_requests_through(tmp_path):
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    store = AsyncSqliteStore(str(tmp_path / "k.db"))
    middleware = IdempotencyMiddleware(app, Idempotency(store=store, scope=single_tenant()))

    async def main():
        await middleware({"type": "lifespan"}, None, None)
        await middleware({"type": "websocket", "path": "/ws"}, None, None)
        await middleware({"type": "http", "method": "GET", "path": "/", "headers": []}, None, None)

    asyncio.run(main())
    assert seen == ["lifespan", "websocket", "http"]


def test_asgi_client_gone_while_sending_its_body_claims_nothing(tmp_path):
    path = str(tmp_path / "k.db")
    SqliteStore(path).migrate()
    called = []

    async def app(scope, receive, send):
        called.append(scope)

    async def main():
        store = AsyncSqliteStore(path)
        middleware = IdempotencyMiddleware(app, Idempotency(store=store, scope=single_tenant()))
        messages = [
            {"type": "http.request", "body": b"{", "more_body": True},
            {"type": "http.disconnect"},
        ]

        async def receive():
            return messages.pop(0)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/x",
            "headers": [(b"idempotency-key", b"gone"), (b"content-type", b"application/json")],
        }
        await middleware(scope, receive, None)  # nothing to send to
        await store.close()

    asyncio.run(main())
    assert called == []
    assert SqliteStore(path).get("default", "gone") is None
