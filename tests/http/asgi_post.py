"""A POST straight to an ASGI app, no server and no test client: for the tests that
look at what the middleware does with the ASGI messages themselves (a body in one
message, the scope it hands on, the header bytes it sends)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from idempotence import AsyncSqliteStore
from idempotence.http import Idempotency, IdempotencyMiddleware, Policy, single_tenant


@asynccontextmanager
async def guarded(
    app: Any, sqlite_path: str, default: Policy | None = None
) -> AsyncIterator[IdempotencyMiddleware]:
    """``app`` behind the middleware, on a SQLite store of its own, for one tenant
    (``default``: the endpoints' policy, else the default one)."""
    store = AsyncSqliteStore(sqlite_path)
    await store.migrate()
    config = Idempotency(store=store, scope=single_tenant("t"), default=default or Policy())
    try:
        yield IdempotencyMiddleware(app, config)
    finally:
        await store.close()


async def asgi_post(
    app: Any, key: bytes, body: bytes = b"", **scope: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """POST ``body`` to ``/x`` with Idempotency-Key ``key``, the whole body in one
    ``http.request`` message; ``scope`` adds to the request's scope (its
    ``extensions``, say). Returns the messages the app sent, and the scope it got."""
    request: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/x",
        "query_string": b"",
        "headers": [(b"idempotency-key", key)],
        **scope,
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(request, receive, send)
    return sent, request
