"""One test app, built on each framework: the same endpoints, the same answers.

Every endpoint is a catch-all route that hands the path and body to :func:`answer`, so
the suites test the middleware, not five routers. Each app counts its executions in
an :class:`Effects`, per path, under a lock (the real-server tests run it threaded).

Endpoints (see :func:`make_config` for how each is guarded):

* ``/charges`` and anything else: 201 with JSON, Location, X-Trace and Set-Cookie;
* ``/reject`` 422, ``/declined`` 402, ``/unavailable`` 503, ``/boom`` raises;
* ``/big/...`` a 4096-byte body, ``/stream`` three streamed chunks, ``/stream-big``
  4000 streamed bytes (guarded with ``max_response_bytes=1024``);
* ``/tx/...`` request-as-transaction: inserts a row through current_transaction();
  ``/tx/reject`` then answers 422;
* ``/slow``: sleeps 20 ms first (for the races);
* ``/rides`` a flow; ``/failing`` a flow that stores its failures: its phase raises,
  or (``{"outcome": "indeterminate"}``) its non-idempotent foreign call times out (R6).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

# Module level: FastAPI and Litestar resolve the endpoints' (string) annotations here.
from fastapi import Request as FastAPIRequest
from fastapi import Response as FastAPIResponse
from litestar import Request as LitestarRequest

from idempotence.flows import Advance, Finish, Flow, PhaseContext, Reject
from idempotence.http import (
    Endpoint,
    Idempotency,
    Policy,
    current_async_transaction,
    current_lease,
    current_transaction,
    header_scope,
)
from idempotence.states import StoredResponse

FRAMEWORKS = ["starlette", "fastapi", "litestar", "flask", "django"]
ASGI = frozenset({"starlette", "fastapi", "litestar"})

BIG = b"x" * 4096
SMALL_LIMIT = 1024
STREAM = [b"chunk-1,", b"chunk-2,", b"chunk-3"]
STREAM_BIG = [b"y" * 1000] * 4
BODY_LIMIT = 2048
TENANT_HEADER = "x-tenant"

TABLE = (
    "CREATE TABLE IF NOT EXISTS http_transfers ("
    "scope TEXT NOT NULL, key_id BIGINT NOT NULL, note TEXT NOT NULL)"
)
#: The application's own write in a request's transaction: ``:name`` placeholders, which
#: every store takes (its dialect writes them as its driver wants).
INSERT = "INSERT INTO http_transfers (scope, key_id, note) VALUES (:scope, :key_id, :note)"


class Effects:
    """Executions per path, counted under a lock."""

    def __init__(self, backend: str = "sqlite") -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.backend = backend

    def hit(self, path: str) -> int:
        with self.lock:
            self.counts[path] += 1
            return self.counts[path]

    def total(self) -> int:
        with self.lock:
            return sum(self.counts.values())


def answer(path: str, body: bytes, effects: Effects) -> tuple[int, list[tuple[str, str]], bytes]:
    """What every app answers on ``path`` (after counting the execution)."""
    n = effects.hit(path)
    if path.endswith("/boom"):
        raise RuntimeError("boom: an unexpected error in the handler")
    status = {"/reject": 422, "/declined": 402, "/unavailable": 503}.get(path, 201)
    if path.startswith("/tx/"):
        status = 422 if path == "/tx/reject" else 201
    payload = json.dumps({"n": n, "path": path, "body": body.decode("utf-8", "replace")})
    data = BIG if path.startswith(("/big", "/bigtx")) else payload.encode()
    headers = [
        ("content-type", "application/json"),
        ("location", f"{path}/{n}"),
        ("x-trace", f"trace-{n}"),
    ]
    return status, headers, data


def cookie(n: int) -> str:
    return f"secret-{n}"


def transfer_params(path: str) -> dict[str, Any]:
    lease = current_lease()
    return {"scope": lease.scope, "key_id": lease.id, "note": path}


# -- a flow endpoint ----------------------------------------------------------------------

rides = Flow("http-test-rides")
FLOW_EFFECTS: list[Effects] = []  # the flow's phases count in the current harness's Effects


@rides.phase("started")
def _create(ctx: PhaseContext) -> Advance:
    amount = ctx.params.get("amount") if isinstance(ctx.params, dict) else None
    if not isinstance(amount, int) or amount <= 0:
        raise Reject(StoredResponse.of(422, {"content-type": "application/json"}, b'{"e":1}'))
    FLOW_EFFECTS[-1].hit("/rides:created")
    return Advance("created")


@rides.phase("created")
def _finish(ctx: PhaseContext) -> Finish:
    FLOW_EFFECTS[-1].hit("/rides:finished")
    body = json.dumps({"ride": ctx.lease.id, "amount": ctx.params["amount"]})
    return Finish(StoredResponse.of(201, {"content-type": "application/json"}, body))


failing = Flow("http-test-failing", store_server_errors=True)


@failing.phase("started")
def _fail_or_call(ctx: PhaseContext) -> Advance:
    if isinstance(ctx.params, dict) and ctx.params.get("outcome") == "indeterminate":
        return Advance("charging")
    raise RuntimeError("boom: an unexpected error in a phase")


def _time_out(ctx: Any) -> Any:
    raise TimeoutError("the provider did not answer")


def _never_recorded(ctx: PhaseContext, result: Any) -> Finish:
    raise AssertionError("a call that timed out is never recorded")


failing.foreign("charging", name="charge", call=_time_out, record=_never_recorded, idempotent=False)


#: The per-endpoint retention of ``/ledger`` (B3): not the default 24 hours.
LEDGER_RETENTION = timedelta(days=7)


def make_config(store: Any, **overrides: Any) -> Idempotency:
    """The suites' configuration; ``overrides`` go to Idempotency, ``default_*`` to
    the default policy (``default_wait=...``)."""
    default = {k[8:]: v for k, v in overrides.items() if k.startswith("default_")}
    rest = {k: v for k, v in overrides.items() if not k.startswith("default_")}
    small = {"max_response_bytes": SMALL_LIMIT}
    endpoints = [
        Endpoint("POST /tx/{name}", Policy(transaction=True, max_body_bytes=BODY_LIMIT)),
        Endpoint("POST /bigtx/{name}", Policy(transaction=True, **small)),
        Endpoint("POST /big/{name}", Policy(**small)),
        Endpoint("POST /stream-big", Policy(**small)),
        Endpoint("POST /optional", Policy(key_required=False)),
        Endpoint("POST /open", Policy(fail_open=True)),
        Endpoint("POST /waiting", Policy(wait=timedelta(seconds=5))),
        Endpoint("POST /ledger", Policy(retention=LEDGER_RETENTION)),
        Endpoint("POST /forever", Policy(retention=None)),
        Endpoint("POST /rides", Policy(flow=rides)),
        Endpoint("POST /failing", Policy(flow=failing)),
        Endpoint("/exempt", None),
    ]
    settings: dict[str, Any] = {
        "max_body_bytes": BODY_LIMIT,
        "exclude_fields": ("meta.sent_at",),
        "replay_headers": ("x-trace",),
        **default,
    }
    return Idempotency(
        store=store,
        scope=rest.pop("scope", header_scope(TENANT_HEADER)),
        endpoints=rest.pop("endpoints", endpoints),
        default=Policy(**settings),
        **rest,
    )


# -- the frameworks -------------------------------------------------------------------------


def starlette_app(effects: Effects, config: Idempotency, *, lifespan: Any = None) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    from idempotence.http import IdempotencyMiddleware

    async def endpoint(request: Request) -> Response:
        path = request.url.path
        body = await request.body()
        if path == "/slow":
            await asyncio.sleep(0.02)
        if path.startswith("/stream"):
            effects.hit(path)
            chunks = STREAM_BIG if path == "/stream-big" else STREAM
            return StreamingResponse(_agen(chunks), status_code=201, media_type="text/plain")
        if path.startswith(("/tx/", "/bigtx/")):
            await current_async_transaction().execute(INSERT, transfer_params(path))
        status, headers, data = answer(path, body, effects)
        response = Response(data, status_code=status, headers=dict(headers))
        response.set_cookie("session", cookie(status))
        return response

    methods = ["GET", "POST", "PATCH", "PUT", "DELETE"]
    app = Starlette(routes=[Route("/{path:path}", endpoint, methods=methods)], lifespan=lifespan)
    app.add_middleware(IdempotencyMiddleware, config=config)
    return app


async def _agen(chunks: list[bytes]) -> Any:
    for chunk in chunks:
        yield chunk


def fastapi_app(effects: Effects, config: Idempotency) -> Any:
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    from idempotence.http import IdempotencyMiddleware

    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST", "PATCH", "PUT", "DELETE"])
    async def endpoint(path: str, request: FastAPIRequest) -> FastAPIResponse:
        path = request.url.path
        body = await request.body()
        if path == "/slow":
            await asyncio.sleep(0.02)
        if path.startswith("/stream"):
            effects.hit(path)
            chunks = STREAM_BIG if path == "/stream-big" else STREAM
            return StreamingResponse(_agen(chunks), status_code=201, media_type="text/plain")
        if path.startswith(("/tx/", "/bigtx/")):
            await current_async_transaction().execute(INSERT, transfer_params(path))
        status, headers, data = answer(path, body, effects)
        response = FastAPIResponse(data, status_code=status, headers=dict(headers))
        response.set_cookie("session", cookie(status))
        return response

    app.add_middleware(IdempotencyMiddleware, config=config)
    return app


def litestar_app(effects: Effects, config: Idempotency) -> Any:
    from litestar import Litestar, Response, route
    from litestar.datastructures import Cookie
    from litestar.response import Stream

    from idempotence.contrib.litestar import idempotency_middleware

    @route("/{path:path}", http_method=["GET", "POST", "PATCH", "PUT", "DELETE"])
    async def endpoint(request: LitestarRequest[Any, Any, Any]) -> Any:
        path = request.url.path
        body = await request.body()
        if path == "/slow":
            await asyncio.sleep(0.02)
        if path.startswith("/stream"):
            effects.hit(path)
            chunks = STREAM_BIG if path == "/stream-big" else STREAM
            return Stream(_agen(chunks), status_code=201, media_type="text/plain")
        if path.startswith(("/tx/", "/bigtx/")):
            await current_async_transaction().execute(INSERT, transfer_params(path))
        status, headers, data = answer(path, body, effects)
        return Response(
            data,
            status_code=status,
            headers=dict(headers),
            cookies=[Cookie(key="session", value=cookie(status))],
            media_type="application/json",
        )

    return Litestar(route_handlers=[endpoint], middleware=[idempotency_middleware(config)])


def flask_app(effects: Effects, config: Idempotency) -> Any:
    from flask import Flask, Response, request

    from idempotence.contrib.flask import install

    app = Flask("idempotence-http-tests")

    @app.route("/", defaults={"path": ""}, methods=["GET", "POST", "PATCH", "PUT", "DELETE"])
    @app.route("/<path:path>", methods=["GET", "POST", "PATCH", "PUT", "DELETE"])
    def endpoint(path: str) -> Response:
        path = request.path
        body = request.get_data()
        if path == "/slow":
            time.sleep(0.02)
        if path.startswith("/stream"):
            effects.hit(path)
            chunks = STREAM_BIG if path == "/stream-big" else STREAM
            return Response(iter(chunks), status=201, mimetype="text/plain")
        if path.startswith(("/tx/", "/bigtx/")):
            current_transaction().execute(INSERT, transfer_params(path))
        status, headers, data = answer(path, body, effects)
        response = Response(data, status=status, headers=headers)
        response.set_cookie("session", cookie(status))
        return response

    install(app, config)
    return app


def django_view(request: Any, path: str) -> Any:
    from django.http import HttpResponse, StreamingHttpResponse

    effects = DJANGO_EFFECTS[-1]
    path = request.path
    body = request.body
    if path == "/slow":
        time.sleep(0.02)
    if path.startswith("/stream"):
        effects.hit(path)
        chunks = STREAM_BIG if path == "/stream-big" else STREAM
        return StreamingHttpResponse(iter(chunks), status=201, content_type="text/plain")
    if path.startswith(("/tx/", "/bigtx/")):
        current_transaction().execute(INSERT, transfer_params(path))
    status, headers, data = answer(path, body, effects)
    response = HttpResponse(data, status=status)
    for name, value in headers:
        response.headers[name] = value
    response.set_cookie("session", cookie(status))
    return response


#: The Effects of the Django harness in use (Django's URLconf is process-wide).
DJANGO_EFFECTS: list[Effects] = []


def iter_chunks(chunks: list[bytes]) -> Iterator[bytes]:
    yield from chunks
