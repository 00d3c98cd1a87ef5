"""The Rocket Rides API: an ASGI (Starlette) app on the idempotence middleware.

::

    POST /v1/rides     origin_lat, origin_lon, target_lat, target_lon (JSON or form)
                       Authorization: Bearer <API key>, Idempotency-Key: <key>
    GET  /v1/rides     the caller's rides, newest first
    GET  /openapi.json the OpenAPI 3.1 description; GET /docs a page about it

``POST /v1/rides`` never reaches a Starlette route: the idempotency middleware
([`idempotence.http`][idempotence.http]) runs the ride flow (`rides`) for it, so the key's
claim, replay, mismatch and in-progress answers, and the 400, 401 and 413 refusals,
are the library's own. The app only says who the caller is (the scope) and what the
flow's parameters are.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from idempotence.database import open_async_sql_store
from idempotence.http import (
    Endpoint,
    Idempotency,
    IdempotencyMiddleware,
    Policy,
    Profile,
    RequestInfo,
)
from idempotence.states import DEFAULT_RETENTION
from idempotence.stores import AsyncStore, AsyncTransaction

from . import openapi
from .chaos import ChaosMiddleware
from .rides import (
    RIDE_COLUMNS,
    async_charger,
    error_response,
    ride_dict,
    ride_params,
    rides_flow,
)
from .schema import User

__all__ = ["ApiSettings", "create_app"]

MAX_BODY_BYTES = 8 * 1024
"""Request bodies larger than this are refused with 413 before anything is claimed."""
PROVIDER_TIMEOUT = 5.0
"""How long the API waits for the provider. A timeout leaves the key to a retry,
which calls again with the same derived key."""


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """What one API worker needs."""

    database: str
    provider_url: str
    profile: Profile = Profile.IETF
    lock_timeout: float = 10.0
    """How long a dead worker keeps a key from its retries (P4, P5)."""
    chaos: bool = False
    """Honour the crash-injection headers (`chaos`): the demo's run only."""
    retention: float = DEFAULT_RETENTION.total_seconds()
    """How long a finished ride's key replays, in seconds (B3); the soak run
    shortens it so that the reaper works while it watches."""


def bearer(header: str | None) -> str | None:
    """The API key in an ``Authorization: Bearer <key>`` header, or None.

    ```python
    bearer("Bearer user-1"), bearer("bearer  user-2 "), bearer(None)
    # ('user-1', 'user-2', None)
    ```
    """
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class Users:
    """The riders by API key, read from ``rocket_users`` when the worker starts. The
    demo's users are seeded and never change, so each worker keeps them in memory and
    the scope lookup costs no query."""

    def __init__(self) -> None:
        self._by_key: dict[str, User] = {}

    async def load(self, store: AsyncStore) -> None:
        async with store.transaction() as tx:
            rows = await tx.execute("SELECT id, api_key, card FROM rocket_users")
        self._by_key = {row["api_key"]: User(**row) for row in rows}

    def of(self, request: RequestInfo) -> User | None:
        key = bearer(request.header("authorization"))
        return None if key is None else self._by_key.get(key)

    def scope(self, request: RequestInfo) -> str | None:
        """The middleware's scope: the rider's id (None answers 401)."""
        user = self.of(request)
        return None if user is None else user.id

    def params(self, request: RequestInfo, body: Any) -> dict[str, Any]:
        """The flow's parameters: the rider's card comes from the account, never
        from the body."""
        user = self.of(request)
        assert user is not None  # the scope callable answered 401 otherwise
        return ride_params(user.id, user.card, body)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS settings of the API's provider client, made once per process: loading
    the CA certificates takes tens of milliseconds, and a worker restarted by a fork of
    the supervisor (`stack`) inherits them instead of loading them again."""
    return ssl.create_default_context()


def create_app(settings: ApiSettings) -> Starlette:
    """The API app for one worker process."""
    store = open_async_sql_store(settings.database)
    users = Users()
    client = httpx.AsyncClient(
        base_url=settings.provider_url, timeout=PROVIDER_TIMEOUT, verify=tls_context()
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await users.load(store)
            yield
        finally:
            await client.aclose()
            await store.close()

    config = _idempotency(settings, store, users, client)
    middleware = [Middleware(IdempotencyMiddleware, config=config)]
    if settings.chaos:
        # Outermost, so that its "respond" point comes after the key is settled.
        middleware.insert(0, Middleware(ChaosMiddleware))
    return Starlette(
        routes=_routes(settings, store, users), middleware=middleware, lifespan=lifespan
    )


def _idempotency(
    settings: ApiSettings, store: AsyncStore, users: Users, client: httpx.AsyncClient
) -> Idempotency:
    # POST /v1/rides: the middleware runs the ride flow for it, charging over ``client``.
    flow = rides_flow(
        async_charger(client),
        profile=settings.profile,
        lock_timeout=timedelta(seconds=settings.lock_timeout),
        retention=timedelta(seconds=settings.retention),
    )
    policy = Policy(
        flow=flow,
        flow_params=users.params,
        max_body_bytes=MAX_BODY_BYTES,
        # A worker that died is retried after about this long; the lock's own
        # remaining time caps it (a live twin usually finishes much sooner).
        in_progress_retry_after=1,
    )
    return Idempotency(
        store=store,
        scope=users.scope,
        endpoints=(Endpoint("POST /v1/rides", policy),),
        # Only the ride endpoint is guarded: there is nothing else to POST to.
        default=None,
        profile=settings.profile,
    )


def _routes(settings: ApiSettings, store: AsyncStore, users: Users) -> list[Route]:
    # Everything but POST /v1/rides, which the middleware answers.
    async def list_rides(request: Request) -> Response:
        info = RequestInfo("GET", request.url.path, headers=_headers(request))
        user = users.of(info)
        if user is None:
            detail = "Send your API key: Authorization: Bearer <key>."
            return _response(error_response(settings.profile, 401, "unauthorized", detail))
        try:
            limit = min(max(int(request.query_params.get("limit", "100")), 1), 1000)
        except ValueError:
            limit = 100
        # A write transaction only because it is the store's one public way in; on
        # SQLite it queues behind the phases for a moment.
        async with store.transaction() as tx:
            rows = await _rides_of(tx, user.id, limit)
        return JSONResponse({"object": "list", "data": rows})

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(openapi.document(settings.profile))

    return [
        Route("/v1/rides", list_rides, methods=["GET"]),
        Route("/openapi.json", openapi_json),
        Route("/docs", _docs),
        Route("/healthz", _health),
        Route("/", _home),
    ]


async def _docs(request: Request) -> Response:
    return HTMLResponse(openapi.DOCS_HTML)


async def _health(request: Request) -> Response:
    return JSONResponse({"ok": True})


async def _home(request: Request) -> Response:
    return RedirectResponse("/docs")


def _headers(request: Request) -> tuple[tuple[str, str], ...]:
    return tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw)


async def _rides_of(tx: AsyncTransaction, user_id: str, limit: int) -> list[dict[str, Any]]:
    rows = await tx.execute(
        f"SELECT {RIDE_COLUMNS} FROM rocket_rides WHERE user_id = :user_id"
        " ORDER BY id DESC LIMIT :limit",
        {"user_id": user_id, "limit": limit},
    )
    return [ride_dict(row) for row in rows]


def _response(stored: Any) -> Response:
    headers: Mapping[str, str] = dict(stored.headers)
    return Response(stored.body, status_code=stored.status, headers=headers)
