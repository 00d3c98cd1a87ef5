"""The app server the network tests run inside an app host's namespace (hosts.py).

Configured by the environment:

* ``NET_STORE``: ``postgres`` (the default), ``redis`` (the Redis store: handler mode
  only, so ``/charges`` alone), or ``cached`` (PostgreSQL with a Redis cache in front);
* ``NET_DATABASE_URL``: the key store's database, reached over the back link;
* ``NET_REDIS_URL`` and ``NET_REDIS_PREFIX``: the Redis of the ``redis`` store (over
  the back link) or of the cache (over the cache link), and the test's key prefix;
* ``NET_PROVIDER``: a SQLite file on this machine's disk, the payment provider's own
  store: it dedups charges by the key it is sent (R4), as a real provider does, and
  lies outside the partition (the disk is shared, not the network);
* ``NET_LOCK_TIMEOUT`` and ``NET_STATEMENT_TIMEOUT``: seconds;
* ``NET_CHARGE_BY``: ``key`` (the default: the provider's key is derived from the
  Idempotency-Key alone) or ``row`` (from the key row's id too, as R4 derives it: a
  key run again on a new row, its first row lost in a failover, charges twice).

Endpoints (scope ``default``):

* ``POST /charges``: handler mode. It charges the provider with a key derived from the
  Idempotency-Key (and counts the run), then works for ``x-work`` seconds; the body
  names the charge;
* ``POST /transfers``: request-as-transaction mode (F3). It inserts a transfer row in
  the request's transaction; the body names the row;
* ``POST /rides``: a flow (R1) of two atomic phases: the first inserts a ride row and
  advances after ``NET_FLOW_WORK`` seconds (0.3), the second finishes with a body
  naming the rows;
* ``GET /health``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

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
from idempotence.stores import AsyncKeyStore
from idempotence.stores.cached import AsyncCachedStore
from idempotence.stores.postgres import AsyncPostgresStore
from idempotence.stores.redis import AsyncRedisStore

if os.environ.get("NET_LOG_TIMES"):
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s", level=logging.INFO)
LOCK = timedelta(seconds=float(os.environ.get("NET_LOCK_TIMEOUT", "2")))
#: "none": the store without a bound, to show what the bound is for.
BOUND_ENV = os.environ.get("NET_STATEMENT_TIMEOUT", "1")
KIND = os.environ.get("NET_STORE", "postgres")
store: AsyncKeyStore
if KIND == "redis":
    store = AsyncRedisStore(
        os.environ["NET_REDIS_URL"], prefix=os.environ["NET_REDIS_PREFIX"], timeout=float(BOUND_ENV)
    )
else:
    primary = AsyncPostgresStore(
        os.environ["NET_DATABASE_URL"],
        statement_timeout=None if BOUND_ENV == "none" else float(BOUND_ENV),
        connect_timeout=1.0,
    )
    store = primary
    if KIND == "cached":
        store = AsyncCachedStore(
            primary, os.environ["NET_REDIS_URL"], prefix=os.environ["NET_REDIS_PREFIX"]
        )
PROVIDER = os.environ["NET_PROVIDER"]
CHARGE_BY = os.environ.get("NET_CHARGE_BY", "key")
FLOW_WORK = float(os.environ.get("NET_FLOW_WORK", "0.3"))


def charge_once(key: str, derived: str) -> str:
    """The provider: one charge per derived key, its id the same on every repeat. Each
    call is counted too (``runs``): how often the handler ran for the key."""
    with sqlite3.connect(PROVIDER, timeout=10) as db:
        db.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, id TEXT)")
        db.execute("CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL)")
        db.execute("INSERT INTO runs VALUES (?)", (key,))
        db.execute("INSERT OR IGNORE INTO charges VALUES (?, ?)", (derived, uuid.uuid4().hex))
        (charge_id,) = db.execute("SELECT id FROM charges WHERE key = ?", (derived,)).fetchone()
    return str(charge_id)


async def charges(request: Request) -> Response:
    key = request.headers["idempotency-key"]
    derived = f"net-{key}-charge"
    if CHARGE_BY == "row":
        derived += f"-{current_lease().id}"
    charge_id = await asyncio.to_thread(charge_once, key, derived)
    await asyncio.sleep(float(request.headers.get("x-work", "0")))
    return JSONResponse({"charge": charge_id}, status_code=201)


async def transfers(request: Request) -> Response:
    key = request.headers["idempotency-key"]
    transfer_id = uuid.uuid4().hex
    tx = current_async_transaction()
    await tx.execute("INSERT INTO net_transfers (key, id) VALUES (%s, %s)", (key, transfer_id))
    await asyncio.sleep(float(request.headers.get("x-work", "0")))
    return JSONResponse({"transfer": transfer_id}, status_code=201)


rides = Flow("net-rides", lock_timeout=LOCK)


@rides.phase("started")
async def create_ride(ctx: PhaseContext) -> Advance:
    await ctx.tx.execute(
        "INSERT INTO net_transfers (key, id) VALUES (%s, %s)", (ctx.lease.key, uuid.uuid4().hex)
    )
    await asyncio.sleep(FLOW_WORK)  # inside the phase's transaction
    return Advance("created")


@rides.phase("created")
async def finish_ride(ctx: PhaseContext) -> Finish:
    rows = await ctx.tx.execute("SELECT id FROM net_transfers WHERE key = %s", (ctx.lease.key,))
    body = JSONResponse({"rides": sorted(row["id"] for row in rows)}).body
    return Finish(StoredResponse.of(201, {"content-type": "application/json"}, body))


async def health(request: Request) -> Response:
    return PlainTextResponse("ok")


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    yield
    await store.close()


app = Starlette(
    routes=[
        Route("/charges", charges, methods=["POST"]),
        Route("/transfers", transfers, methods=["POST"]),
        Route("/health", health),
    ],
    lifespan=lifespan,
)
app.add_middleware(
    IdempotencyMiddleware,
    config=Idempotency(
        store=store,
        scope=single_tenant(),
        endpoints=[Endpoint("POST /charges", Policy(lock_timeout=LOCK))]
        + (
            []
            if KIND == "redis"  # a key store: handler mode only
            else [
                Endpoint("POST /transfers", Policy(transaction=True, lock_timeout=LOCK)),
                Endpoint("POST /rides", Policy(flow=rides)),
            ]
        ),
    ),
)
