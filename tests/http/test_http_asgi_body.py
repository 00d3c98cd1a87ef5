"""A body a server hands over in one message (as uvicorn does a small one): read
whole and given to the app, fingerprinted, and refused past the endpoint's limit even
with no Content-Length to refuse it by, before the app runs."""

from __future__ import annotations

import asyncio
from typing import Any

from idempotence.http import Policy
from tests.http.asgi_post import asgi_post, guarded


def one_message_calls(sqlite_path: str, bodies: list[bytes]) -> tuple[list[int], list[bytes]]:
    """Each body POSTed with the same key in one ``http.request`` message: the
    statuses answered, and the bodies the app was given."""
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        seen.append(message["body"])
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run() -> list[int]:
        statuses = []
        async with guarded(app, sqlite_path, Policy(max_body_bytes=8)) as middleware:
            for body in bodies:
                sent, _ = await asgi_post(middleware, b"k1", body)
                statuses.append(sent[0]["status"])
        return statuses

    return asyncio.run(run()), seen


def test_a_body_in_one_message_is_the_apps_and_the_fingerprints(sqlite_path):
    statuses, seen = one_message_calls(sqlite_path, [b"abc", b"abc", b"abd"])
    assert statuses == [201, 201, 422]  # replayed, then another body: a mismatch
    assert seen == [b"abc"]


def test_a_body_in_one_message_past_the_limit_is_413_and_runs_nothing(sqlite_path):
    statuses, seen = one_message_calls(sqlite_path, [b"123456789", b"12345678"])
    assert statuses == [413, 201]  # the limit is 8 bytes; nothing was claimed by the first
    assert seen == [b"12345678"]


def answered_headers(sqlite_path: str, app_headers: list[tuple[bytes, bytes]]) -> tuple[Any, Any]:
    """The headers a guarded app's first answer goes out with, and the app's own."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": app_headers})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run() -> Any:
        async with guarded(app, sqlite_path) as middleware:
            sent, _ = await asgi_post(middleware, b"k2")
        return sent[0]["headers"]

    return asyncio.run(run()), app_headers


def test_an_answer_with_its_length_goes_out_with_the_apps_own_header_bytes(sqlite_path):
    sent, own = answered_headers(
        sqlite_path, [(b"content-type", b"text/x"), (b"content-length", b"2")]
    )
    assert sent is own


def test_an_answer_without_its_length_is_given_one(sqlite_path):
    sent, _ = answered_headers(sqlite_path, [(b"content-type", b"text/x")])
    assert list(sent) == [(b"content-type", b"text/x"), (b"content-length", b"2")]
