"""A guarded app that misbehaves on order, in a server process of its own, for the
client's tests (tests/http/test_client.py).

    python -m tests.http.chaos_server sqlite|postgres TARGET DIR PORT

It serves on ``PORT`` (the tests restart it there after a kill). ``POST /charges``
is a request-as-transaction endpoint (F3): its effect is a row in ``crash_effects``,
committed with the key, so the count of rows is the count of executions. A body
``{"declined": true}`` answers 402, which is stored like any final answer;
``{"invalid": true}`` answers 422 (refused: nothing stored). ``POST /charges/slow``
and ``POST /charges/failing`` are plain handlers: the first takes ``SLOW`` seconds,
the second answers a 500 that is stored (``store_server_errors=True``). ``POST
/reports`` is a flow endpoint with asynchronous acceptance (:func:`report_flow`).

Every request is logged, with the server's clock, as one JSON line in
``DIR/attempts.jsonl``; request number ``n`` (0-based, counted across restarts by
that log) obeys ``DIR/plan.json[n]`` (``"ok"`` past its end):

* ``ok``: served normally;
* ``drop``: served (the effect commits, the answer is stored), then the connection is
  closed in the middle of the response;
* ``kill``: served, then the process SIGKILLs itself before sending a byte;
* ``slow-drop``: the handler runs on in the background while the connection is
  dropped at once; on ``POST /charges/slow`` (a plain handler that takes ``SLOW``
  seconds) the retry finds the key in progress: a real 409 (P4);
* ``503:N``, ``429:N``: answered 503 or 429 with ``Retry-After: N`` (seconds), and
  ``429:date:N`` with an HTTP-date N seconds ahead; ``503`` without a number sends
  no Retry-After.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from datetime import timedelta
from email.utils import formatdate
from pathlib import Path
from typing import Any

from idempotence.flows import Advance, Finish, Flow, PhaseContext
from idempotence.http import (
    Endpoint,
    Idempotency,
    IdempotencyMiddleware,
    Policy,
    current_async_transaction,
    current_lease,
    single_tenant,
)
from idempotence.states import StoredResponse
from tests.http.crash_server import INSERT, effect, open_store

#: How long a ``slow-drop`` handler runs.
SLOW = 1.5
LOCK_TIMEOUT = timedelta(seconds=1)

Scope = dict[str, Any]


#: How long the second phase of the report flow takes.
REPORT_TIME = 1.5


def report_flow(backend: str, directory: Path) -> Flow:
    """A long flow for asynchronous acceptance: phase ``started`` records the effect
    and commits ``built``; phase ``built`` takes ``REPORT_TIME`` seconds, and while
    ``DIR/hang`` exists it creates ``DIR/reached`` and waits (the loop stays free), so
    a test can kill the server mid-flow."""
    flow = Flow("chaos-report", lock_timeout=LOCK_TIMEOUT)
    hang, reached = directory / "hang", directory / "reached"

    @flow.phase("started")
    async def build(ctx: PhaseContext) -> Advance:
        await ctx.tx.execute(INSERT, effect("report", ctx.lease.scope, ctx.lease.key))
        return Advance("built")

    @flow.phase("built")
    async def publish(ctx: PhaseContext) -> Finish:
        while hang.exists():
            reached.touch()
            await asyncio.sleep(0.05)
        await asyncio.sleep(REPORT_TIME)
        body = json.dumps({"report": ctx.lease.id, "pages": ctx.params["pages"]})
        return Finish(StoredResponse.of(201, {"content-type": "application/json"}, body))

    return flow


def guarded_app(backend: str, target: str, directory: Path) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    store = open_store(backend, target, asynchronous=True)

    async def charge(request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("invalid"):
            return JSONResponse({"error": "amount must be positive"}, status_code=422)
        lease = current_lease()
        await current_async_transaction().execute(INSERT, effect("charge", lease.scope, lease.key))
        status = 402 if body.get("declined") else 201
        return JSONResponse({"execution": uuid.uuid4().hex}, status_code=status)

    async def slow_charge(request: Request) -> JSONResponse:
        # A plain handler: its claim commits first, so a retry meanwhile meets 409 (P4).
        await asyncio.sleep(SLOW)
        lease = current_lease()
        async with store.transaction() as tx:
            await tx.execute(INSERT, effect("charge", lease.scope, lease.key))
        return JSONResponse({"execution": uuid.uuid4().hex}, status_code=201)

    async def failing_charge(request: Request) -> JSONResponse:
        # Its 500 is stored (store_server_errors=True, as Stripe does): a replay is final.
        lease = current_lease()
        async with store.transaction() as tx:
            await tx.execute(INSERT, effect("charge", lease.scope, lease.key))
        return JSONResponse({"error": "the ledger is closed"}, status_code=500)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({})

    app = Starlette(
        routes=[
            Route("/charges", charge, methods=["POST"]),
            Route("/charges/slow", slow_charge, methods=["POST"]),
            Route("/charges/failing", failing_charge, methods=["POST"]),
            Route("/health", health),
        ]
    )
    config = Idempotency(
        store=store,
        scope=single_tenant("chaos"),
        endpoints=[
            Endpoint("POST /charges", Policy(transaction=True, lock_timeout=LOCK_TIMEOUT)),
            Endpoint("POST /charges/slow", Policy(lock_timeout=LOCK_TIMEOUT)),
            Endpoint("POST /charges/failing", Policy(store_server_errors=True)),
            Endpoint(
                "POST /reports",
                Policy(flow=report_flow(backend, directory), asynchronous=True),
            ),
        ],
        default=None,
    )
    return IdempotencyMiddleware(app, config)


class Chaos:
    """The misbehaving front of the guarded app (pure ASGI)."""

    def __init__(self, app: Any, directory: Path) -> None:
        self.app = app
        self.log = directory / "attempts.jsonl"
        self.plan = directory / "plan.json"
        self.background: set[asyncio.Task[None]] = set()

    def next_action(self, key: str) -> str:
        done = self.log.read_text().count("\n") if self.log.exists() else 0
        plan = json.loads(self.plan.read_text()) if self.plan.exists() else []
        action = plan[done] if done < len(plan) else "ok"
        with self.log.open("a") as log:
            log.write(json.dumps({"at": time.time(), "key": key, "action": action}) + "\n")
        return str(action)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        action = self.next_action(headers.get(b"idempotency-key", b"").decode())
        if action[:3] in ("503", "429"):
            return await refuse(action, send)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if action == "slow-drop":
            task = asyncio.create_task(served(self.app, scope, body))
            self.background.add(task)
            task.add_done_callback(self.background.discard)
            return await drop(send)
        start, content = await served(self.app, scope, body)  # the effect has committed
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        await send(start)
        if action == "drop":
            return await drop(send)
        await send({"type": "http.response.body", "body": content})


async def drop(send: Any) -> None:
    """Close the connection mid-response: a status line and headers go out, the body
    never does (uvicorn closes a connection whose app fails after the start)."""
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"64")]}
    )
    raise ConnectionAbortedError("chaos: the connection dropped mid-response")


async def served(app: Any, scope: Scope, body: bytes) -> tuple[dict[str, Any], bytes]:
    """Run ``app`` to the end; its response start message and its body."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def capture(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, capture)
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0], content


async def refuse(action: str, send: Any) -> None:
    status, _, after = action.partition(":")
    headers = [(b"content-type", b"application/json")]
    if after.startswith("date:"):
        when = time.time() + int(after.removeprefix("date:"))
        headers.append((b"retry-after", formatdate(when, usegmt=True).encode()))
    elif after:
        headers.append((b"retry-after", after.encode()))
    await send({"type": "http.response.start", "status": int(status), "headers": headers})
    await send({"type": "http.response.body", "body": b'{"error": "chaos"}'})


def main() -> None:
    import uvicorn

    backend, target, directory, port = sys.argv[1:5]
    app = Chaos(guarded_app(backend, target, Path(directory)), Path(directory))
    config = uvicorn.Config(app, host="127.0.0.1", port=int(port), log_level="critical")
    uvicorn.Server(config).run()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
