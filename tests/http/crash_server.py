"""A guarded app in a server process of its own, for the kill-and-restart tests.

    python -m tests.http.crash_server uvicorn|waitress BACKEND TARGET DIR

BACKEND is ``sqlite``, ``postgres``, ``mariadb`` or ``redis`` (TARGET: the store's path or URL),
or ``cached-sqlite`` / ``cached-postgres``, a cached store (TARGET:
``PRIMARY|REDIS_URL``). On Redis, a KeyStore, only the plain handler endpoint
``/handle/{name}`` exists, and a cached store serves only that one too: the suites
run only the plain handlers' crash tests through a cache.

It prints its port on stdout, then serves. Its effects are rows in ``crash_effects``
on the store's database, so they outlive the process. While ``DIR/hang`` exists, an
endpoint that reaches its hang point creates ``DIR/reached`` and sleeps, holding
whatever it holds, until the test SIGKILLs the process:

* ``POST /tx/{name}`` (request-as-transaction, F3): inserts an effect row in the
  request's transaction, then hangs: the kill rolls the claim back with the row;
* ``POST /rides`` (a two-phase flow): phase ``started`` inserts the effect row and
  commits the recovery point ``created``; phase ``created`` hangs: the kill leaves a
  locked key at ``created``, which the retry resumes there once the lock expires;
* ``POST /handle/{name}`` (a plain handler, no transaction): appends a line to
  ``DIR/handled-<key>`` for each execution, then hangs, or sleeps for the seconds
  written in ``DIR/slow`` (a live handler slower than its lock timeout, F2), and
  answers 201 with a body of its own execution.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from idempotence._backends import by_name
from idempotence.flows import Advance, Finish, Flow, PhaseContext
from idempotence.http import (
    Endpoint,
    Idempotency,
    Policy,
    current_async_transaction,
    current_lease,
    current_transaction,
    single_tenant,
)
from idempotence.states import StoredResponse

TABLE = (
    "CREATE TABLE IF NOT EXISTS crash_effects ("
    "scope TEXT NOT NULL, request_key TEXT NOT NULL, what TEXT NOT NULL)"
)
#: ``:name`` placeholders, which every store takes in the application's statements.
INSERT = "INSERT INTO crash_effects (scope, request_key, what) VALUES (:scope, :key, :what)"
#: How long a killed worker's lock holds the key before a retry may take it over (P5).
LOCK_TIMEOUT = timedelta(seconds=1)


class Hang:
    def __init__(self, directory: Path) -> None:
        self.flag = directory / "hang"
        self.reached = directory / "reached"

    def point(self) -> None:
        """Hang here if told to: the test kills the process while it sleeps."""
        if self.flag.exists():
            self.reached.touch()
            time.sleep(3600)

    def handle(self, key: str) -> dict[str, str]:
        """A plain handler's work: record one execution, hang or be slow, answer."""
        execution = uuid.uuid4().hex
        with (self.flag.parent / f"handled-{key}").open("a") as executions:
            executions.write(execution + "\n")
        self.point()
        slow = self.flag.parent / "slow"
        if slow.exists():
            time.sleep(float(slow.read_text()))
        return {"execution": execution}


def effect(what: str, scope: str, key: str) -> dict[str, str]:
    return {"scope": scope, "key": key, "what": what}


def rides_flow(backend: str, hang: Hang, *, asynchronous: bool) -> Flow:
    flow = Flow("crash-test-rides", lock_timeout=LOCK_TIMEOUT)
    insert = INSERT

    def finish(ctx: PhaseContext) -> Finish:
        hang.point()
        body = json.dumps({"ride": ctx.lease.id, "amount": ctx.params["amount"]})
        return Finish(StoredResponse.of(201, {"content-type": "application/json"}, body))

    if asynchronous:

        @flow.phase("started")
        async def create_async(ctx: PhaseContext) -> Advance:
            await ctx.tx.execute(insert, effect("ride", ctx.lease.scope, ctx.lease.key))
            return Advance("created")

    else:

        @flow.phase("started")
        def create(ctx: PhaseContext) -> Advance:
            ctx.tx.execute(insert, effect("ride", ctx.lease.scope, ctx.lease.key))
            return Advance("created")

    flow.phase("created")(finish)
    return flow


def config(store: Any, backend: str, hang: Hang, *, asynchronous: bool) -> Idempotency:
    handler = [Endpoint("POST /handle/{name}", Policy(lock_timeout=LOCK_TIMEOUT))]
    # Redis runs nothing else; a cached store could, but only its handlers' tests use it.
    if backend == "redis" or backend.startswith("cached-"):
        return Idempotency(
            store=store, scope=single_tenant("crash"), endpoints=handler, default=None
        )
    flow = rides_flow(backend, hang, asynchronous=asynchronous)
    return Idempotency(
        store=store,
        scope=single_tenant("crash"),
        endpoints=[
            Endpoint("POST /tx/{name}", Policy(transaction=True, lock_timeout=LOCK_TIMEOUT)),
            Endpoint("POST /rides", Policy(flow=flow)),
            *handler,
        ],
        default=None,
    )


def open_store(backend: str, target: str, *, asynchronous: bool) -> Any:
    """The store of ``backend`` on ``target`` (from the library's table of backends: a
    new one needs nothing here); ``cached-<backend>`` is a cached store in front of
    that backend's store, and ``target`` then ``PRIMARY|REDIS_URL``."""
    primary = backend.removeprefix("cached-")
    sync, async_ = by_name(primary).store_classes()
    if primary == backend:
        return (async_ if asynchronous else sync)(target)
    from idempotence.stores.cached import AsyncCachedStore, CachedStore

    where, redis_url = target.rsplit("|", 1)
    if asynchronous:
        return AsyncCachedStore(async_(where), redis_url)
    return CachedStore(sync(where), redis_url)


def asgi_app(backend: str, target: str, hang: Hang) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from idempotence.http import IdempotencyMiddleware

    store = open_store(backend, target, asynchronous=True)

    async def transfer(request: Request) -> JSONResponse:
        lease = current_lease()
        await current_async_transaction().execute(
            INSERT, effect("transfer", lease.scope, lease.key)
        )
        hang.point()
        return JSONResponse({"transfer": lease.id}, status_code=201)

    async def handle(request: Request) -> JSONResponse:
        # A thread, as a blocking handler runs in Starlette: the loop stays free to beat.
        body = await asyncio.to_thread(hang.handle, current_lease().key)
        return JSONResponse(body, status_code=201)

    app = Starlette(
        routes=[
            Route("/tx/{name}", transfer, methods=["POST"]),
            Route("/handle/{name}", handle, methods=["POST"]),
        ]
    )
    return IdempotencyMiddleware(app, config(store, backend, hang, asynchronous=True))


def wsgi_app(backend: str, target: str, hang: Hang) -> Any:
    from flask import Flask

    from idempotence.contrib.flask import install

    store = open_store(backend, target, asynchronous=False)
    app = Flask("crash-server")

    @app.post("/tx/<name>")
    def transfer(name: str) -> Any:
        lease = current_lease()
        current_transaction().execute(INSERT, effect("transfer", lease.scope, lease.key))
        hang.point()
        return {"transfer": lease.id}, 201

    @app.post("/handle/<name>")
    def handle(name: str) -> Any:
        return hang.handle(current_lease().key), 201

    install(app, config(store, backend, hang, asynchronous=False))
    return app


def main() -> None:
    server, backend, target, directory = sys.argv[1:5]
    hang = Hang(Path(directory))
    if server == "uvicorn":
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        print(sock.getsockname()[1], flush=True)
        app = asgi_app(backend, target, hang)
        uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(
            sockets=[sock]
        )
    else:
        from waitress.server import create_server

        wsgi = create_server(wsgi_app(backend, target, hang), host="127.0.0.1", port=0)
        print(wsgi.effective_port, flush=True)
        wsgi.run()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
