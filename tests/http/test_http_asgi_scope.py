"""The scope a guarded ASGI app runs with: server extensions that would send a
response without body messages are hidden from it (its response must be buffered),
and a scope without them is handed over as it is, not copied per request."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from tests.http.asgi_post import asgi_post, guarded


def guarded_call(sqlite_path: str, extensions: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen["scope"] = scope
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run() -> Any:
        async with guarded(app, sqlite_path) as middleware:
            sent, scope = await asgi_post(
                middleware, str(uuid.uuid4()).encode(), extensions=extensions
            )
        assert sent[0]["status"] == 201
        return scope

    outer = asyncio.run(run())
    return seen["scope"], outer


def test_extensions_that_skip_body_messages_are_hidden_from_a_guarded_app(sqlite_path):
    extensions = {"http.response.pathsend": {}, "http.response.trailers": {}, "tls": {"v": 1}}
    inner, outer = guarded_call(sqlite_path, extensions)
    assert inner["extensions"] == {"tls": {"v": 1}}
    assert outer["extensions"] == extensions  # the server's scope is left as it was


def test_a_scope_without_them_is_the_servers_own(sqlite_path):
    inner, outer = guarded_call(sqlite_path, {"tls": {"v": 1}})
    assert inner is outer
