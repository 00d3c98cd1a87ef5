"""The idempotency middleware for ASGI apps (Starlette, FastAPI, Litestar, ...).

Pure ASGI: non-HTTP scopes and unguarded requests go straight to the app; for a
guarded request, ``receive`` is wrapped to read the body (and hand it to the app
again), ``send`` to capture the response. Per-request state lives in the
`_Exchange` each call makes, never on the middleware.

```python
from idempotence import AsyncPostgresStore
from idempotence.http import Idempotency
from idempotence.http.asgi import IdempotencyMiddleware
app.add_middleware(
    IdempotencyMiddleware,
    config=Idempotency(
        store=AsyncPostgresStore("postgresql://app@db/app"),
        scope=lambda request: request.raw["state"]["account_id"],
    ),
)
```

It needs an async store
([`AsyncPostgresStore`][idempotence.stores.postgres.AsyncPostgresStore],
[`AsyncSqliteStore`][idempotence.stores.sqlite.AsyncSqliteStore], or another
[`AsyncKeyStore`][idempotence.stores.redis.AsyncKeyStore] for plain handler endpoints)
and an asyncio server (uvicorn, hypercorn's asyncio worker, granian...); put it outside
the app's routing and inside the middleware that authenticates, so the scope callable
can see the tenant.

While a guarded app runs, its response is held back (see `_core`), and so is a
client's disconnect: the work completes and is stored for the client's retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .._frozen import quick_new
from ..errors import BodyTooLarge, ConfigurationError
from ..flows.effects import DoHandle
from ..stores import AsyncKeyStore, AsyncTransaction
from ..stores.keyvalue import is_async
from ._config import Idempotency
from ._context import bound
from ._core import lifecycle
from ._driver_async import drive_async
from ._effects import Capture, Captured, Reply, ReplyKind
from ._request import RequestInfo

__all__ = ["IdempotencyMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Server extensions that send a response without body messages we could buffer: a
# guarded request's app does not see them, so it falls back to plain body messages.
_UNBUFFERABLE = frozenset(
    {"http.response.pathsend", "http.response.zerocopysend", "http.response.trailers"}
)


_SIZED = (list, tuple)
"""Header collections an app's answer is sent with again as they are (not a
generator, which the capture read through)."""


# Every guarded request makes one (method, path, query, headers, raw, path_params):
# past the class call (see quick_new).
_new_request_info = quick_new(RequestInfo)


class _Disconnected(Exception):
    """The client went away while we read its body: nothing was claimed."""


class IdempotencyMiddleware:
    """Make POST and PATCH (by default) exactly-once per ``Idempotency-Key``."""

    def __init__(self, app: ASGIApp, config: Idempotency) -> None:
        store = config.store
        if not is_async(store):
            raise ConfigurationError(
                "the ASGI middleware needs an async store: AsyncPostgresStore, "
                f"AsyncSqliteStore or another AsyncKeyStore, not {type(store).__name__}"
            )
        self.app = app
        self.config = config
        self.store: AsyncKeyStore = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        found = self.config.resolve(scope["method"], scope["path"])
        if found is None:
            await self.app(scope, receive, send)  # P9
            return
        policy, params = found
        request = _new_request_info(
            scope["method"],
            scope["path"],
            scope.get("query_string", b"").decode("latin-1"),
            tuple([(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]),
            scope,
            params,
        )
        exchange = _Exchange(self.app, scope, receive, send)
        engine = lifecycle(self.config, policy, request, exchange)
        try:
            reply = await drive_async(engine, self.store, exchange)
        except _Disconnected:
            return
        await exchange.reply(reply)


class _Exchange:
    """One request's state: its body, the app's response as it comes."""

    def __init__(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        self.app = app
        self.scope = scope
        self.receive = receive
        self.send = send
        self.body: bytes | None = None
        self.start: Message | None = None
        #: An exception of the app's after its too-large response began to stream.
        self.error: Exception | None = None

    async def read_body(self, limit: int) -> bytes:
        message = await self.receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            # The whole body in one message, as most servers send a small one.
            body: bytes = message.get("body", b"")
            if len(body) > limit:
                raise BodyTooLarge()
            self.body = body
            return body
        return await self._read_chunks(message, limit)

    async def _read_chunks(self, message: Message, limit: int) -> bytes:
        chunks, size = [], 0
        while True:
            if message["type"] == "http.disconnect":
                raise _Disconnected()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge()
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
            message = await self.receive()
        self.body = b"".join(chunks)
        return self.body

    def replay_receive(self, complete: asyncio.Event | None = None) -> Receive:
        """A ``receive`` that hands the app the body we read, then what is left.

        While the response is being buffered (``complete`` given), nothing is left
        for the app but to wait: a client that went away is not told to the app, so
        the work completes and is stored for the retry, and an app that listens for
        the disconnect while it streams (Litestar does) gets ``http.disconnect`` once
        its response is complete, as a server would say, instead of waiting forever
        for a response we hold back.
        """
        pending = True

        async def receive() -> Message:
            nonlocal pending
            if pending:
                pending = False
                return {"type": "http.request", "body": self.body or b"", "more_body": False}
            if complete is None:
                return await self.receive()
            await complete.wait()
            return {"type": "http.disconnect"}

        return receive

    async def run_app(
        self,
        run: DoHandle,
        tx: AsyncTransaction | None,
        overflow: Callable[[int], Awaitable[None]] | None,
    ) -> Captured:
        """Run the app for the engine ([`DoHandle`][idempotence.http.wsgi.DoHandle]),
        with ``tx`` and the lease bound for the handler."""
        capture = Capture(run.limit)
        complete = asyncio.Event()
        streaming = False

        async def send(message: Message) -> None:
            nonlocal streaming
            kind = message["type"]
            if kind == "http.response.body" and not message.get("more_body", False):
                complete.set()
            if streaming:
                await self.send(message)
            elif kind == "http.response.start":
                self.start = message
                headers = message.get("headers", ())
                capture.start(
                    message["status"],
                    [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
                )
            elif kind == "http.response.body":
                if capture.add(message.get("body", b"")) and overflow is not None:
                    # Too large to store: settle the key, then stream it through.
                    assert self.start is not None
                    assert capture.status is not None
                    await overflow(capture.status)
                    streaming = True
                    await self.send(self.start)
                    more = message.get("more_body", False)
                    await self.send(
                        {
                            "type": "http.response.body",
                            "body": capture.buffered(),
                            "more_body": more,
                        }
                    )
            else:
                await self.send(message)  # informational (e.g. the test client's debug)

        scope = self.scope
        extensions = scope.get("extensions") or {}
        if not _UNBUFFERABLE.isdisjoint(extensions):
            scope = dict(scope)
            scope["extensions"] = {k: v for k, v in extensions.items() if k not in _UNBUFFERABLE}
        try:
            with bound(tx, run.lease):
                await self.app(scope, self.replay_receive(complete), send)
        except Exception as exc:
            if not streaming:
                raise
            self.error = exc  # the key is settled; re-raised once the lifecycle ends
        return capture.result()

    async def reply(self, reply: Reply) -> None:
        if reply.kind is ReplyKind.SENT:
            if self.error is not None:
                raise self.error
            return
        if reply.kind is ReplyKind.PASS:
            receive = self.receive if self.body is None else self.replay_receive()
            await self.app(self.scope, receive, self.send)
            return
        response = reply.response
        assert response is not None
        raw: Any = () if self.start is None or not reply.original else self.start.get("headers")
        if type(raw) in _SIZED and len(raw) == len(response.headers):
            # The app's own answer with the headers it sent (finalizing only adds):
            # its header bytes as they were, not encoded again.
            headers = raw
        else:
            headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
        await self.send(
            {"type": "http.response.start", "status": response.status, "headers": headers}
        )
        await self.send({"type": "http.response.body", "body": response.body, "more_body": False})
