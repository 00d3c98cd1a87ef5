"""HTTP middleware throughput as users deploy it: guarded FastAPI endpoints against the
same endpoints unguarded, and against the same statements written by hand.

Run it from the repository root::

    .venv/bin/python benchmarks/http_bench.py                 # every server, about 10 minutes
    .venv/bin/python benchmarks/http_bench.py --quick         # a smoke run, about a minute
    .venv/bin/python benchmarks/http_bench.py --server pg-fast --server sqlite --json
    .venv/bin/python benchmarks/http_bench.py --server pg-fast --row transaction \
        --row transaction-floor --row transaction-floor-1w     # those rows and insert
    .venv/bin/python benchmarks/http_bench.py --server pg-fast --server redis \
        --deploy 1 --deploy uvicorn-2 --deploy gunicorn-2        # as deployed, ~15 minutes

Each server is one uvicorn process (uvloop, httptools) serving a FastAPI app, started
before the first round and kept to the end; ``wrk`` (C) keeps ``--connections``
keep-alive connections busy with JSON POSTs, each with a new Idempotency-Key (replay
rows: one key throughout, settled before the rounds). Every row runs ``--rounds`` times,
the rounds in alternating order, and the table shows medians.

Servers (``--server``, repeatable; all by default):

``pg``             the machine's PostgreSQL as configured (``--postgres``), a new database
``pg-fast``        a throwaway cluster with fsync=off, synchronous_commit=off
``sqlite``         a file, SQLite's default durability (synchronous=FULL)
``sqlite-normal``  the same with ``AsyncSqliteStore(..., synchronous="NORMAL")``
``redis``          a throwaway redis-server, when ``open_async_store("redis://...")``
                   works in this checkout (else skipped with a printed line)
``pg-fast+cache``  ``AsyncCachedStore``: the ``pg-fast`` cluster (a database of its own)
                   with the redis-server in front of it for replays (likewise skipped)

Deployments (``--deploy``, repeatable; ``1`` by default), one after another, each with
every ``--server`` in a database of its own and its own interleaved rounds:

``1``           one uvicorn process, as above (servers keep their plain names)
``uvicorn-N``   ``uvicorn --workers N``: uvicorn's supervisor, N spawned workers
``gunicorn-N``  ``gunicorn -w N -k uvicorn_worker.UvicornWorker``: gunicorn's arbiter,
                N forked workers

Each worker builds its own app, store and pool, as in production. A deployed server is
named ``SERVER/DEPLOY`` (``redis/gunicorn-2``); its rows are compared with their
baselines in the same deployment, and ``app ms`` sums the CPU of every process of the
deployment (``procs``: how many were metered).

Rows on each server (``ratio`` is req/s over the row named in ``vs``):

``trivial``         baseline: the endpoint, no middleware, no database
``insert``          baseline: the endpoint doing its one INSERT in a transaction, by
                    hand with psycopg / sqlite3 (the floor for request-as-transaction)
``handler``         the middleware, handler mode, on the trivial endpoint (vs trivial)
``handler-floor``   the same claim and finish statements by hand in the endpoint, no
                    library: claim (autocommit), answer, finish (vs trivial)
``transaction``     request-as-transaction: claim, INSERT and stored response in one
                    transaction (vs insert)
``transaction-floor`` the same by hand: BEGIN+claim, INSERT, finish+COMMIT (vs insert)
``transaction-floor-1w`` (PostgreSQL) the key row written once: BEGIN+advisory lock+read,
                    INSERT, the finished row inserted+COMMIT (vs insert)
``replay``          handler mode, one key throughout: every request replays (vs trivial)
``replay-floor``    the claim statement by hand on a finished key, answering the stored
                    response (vs trivial)
``... @c1``         trivial, handler, insert and transaction at one connection: latency

On Redis and on the cached store only ``trivial``, ``handler``, ``replay``, their
``@c1`` rows and the handler-mode floors run (no request-as-transaction on Redis). On
Redis ``handler-floor`` and ``replay-floor`` send the store's own claim and finish
scripts (``redis.lua``) by EVALSHA on one bare asyncio connection, pipelined as the
store's own, with hiredis's parser. On the cached store ``handler`` pays the
PostgreSQL claim and finish plus the write of the finished response to Redis, and
``replay`` is answered from Redis alone; its floors send the same by hand
(``_harness.CachedHand``: ``PgHand``'s pool and a bare Redis connection): a new key
is a Redis GET (nil), the claim, the finish returning its two times, and the entry
(``E`` + row id + the finished row as JSON, the store's bytes) stored by EVALSHA of
the store's ``SET_SCRIPT``; a replay is the GET alone, answered from the entry.

Below the table, each guarded row against its floor on the same server
(``redis: handler / handler-floor = 0.78``, ``pg-fast+cache: replay / replay-floor``):
req/s over the floor's, the share of the hand-written statements' throughput the
library keeps.

CPU per request comes from /proc: ``app ms`` is the uvicorn process (deployed: every
process of the deployment), ``db ms`` the PostgreSQL backends of the benchmark's
database (``all-db ms``: the whole cluster, WAL writer and checkpointer included; on
the machine's shared server also other tenants' load), for Redis the redis-server.
SQLite runs in the app process. The script measures and never judges: it exits 0
whatever the ratios.
"""

import argparse
import asyncio
import contextlib
import os
import re
import tempfile
from collections.abc import Callable
from typing import Any

import _harness as harness

SERVERS = ("pg", "pg-fast", "sqlite", "sqlite-normal", "redis", "pg-fast+cache")
#: The servers that need our Redis store (skipped, with a line, in a checkout without).
ON_REDIS = ("redis", "pg-fast+cache")
TABLE = "CREATE TABLE IF NOT EXISTS bench_items (amount INTEGER NOT NULL, note TEXT NOT NULL)"
INSERT = {
    "postgres": "INSERT INTO bench_items (amount, note) VALUES (%(amount)s, %(note)s)",
    "sqlite": "INSERT INTO bench_items (amount, note) VALUES (:amount, :note)",
}


def rows(server: str, backend: str) -> list[harness.Row]:
    """The rows of one server; Redis and the cached store have handler-mode floors
    only (the cached store's: PostgreSQL's statements and Redis's commands at once)."""
    row = harness.Row
    found = [
        row(server, "trivial", "/plain/trivial", None),
        row(server, "handler", "/guarded/handler", "trivial"),
        row(server, "replay", "/guarded/handler", "trivial", fixed=True),
    ]
    if backend in ("redis", "cached"):
        found += [
            row(server, "handler-floor", "/plain/floor-handler", "trivial"),
            row(server, "replay-floor", "/plain/floor-handler", "trivial", fixed=True),
        ]
    if backend in INSERT:
        found[1:1] = [row(server, "insert", "/plain/insert", None)]
        found += [
            row(server, "handler-floor", "/plain/floor-handler", "trivial"),
            row(server, "transaction", "/guarded/tx", "insert"),
            row(server, "transaction-floor", "/plain/floor-tx", "insert"),
            *(
                [row(server, "transaction-floor-1w", "/plain/floor-tx-1w", "insert")]
                if backend == "postgres"
                else []
            ),
            row(server, "replay-floor", "/plain/floor-handler", "trivial", fixed=True),
        ]
    found += [
        row(server, "trivial", "/plain/trivial", None, connections=1),
        row(server, "handler", "/guarded/handler", "trivial", connections=1),
    ]
    if backend in INSERT:
        found.append(row(server, "insert", "/plain/insert", None, connections=1))
        found.append(row(server, "transaction", "/guarded/tx", "insert", connections=1))
    return found


#: What the summary compares: (the row, its floor), on every server that has both.
FLOORS = (
    ("handler", "handler-floor"),
    ("replay", "replay-floor"),
    ("transaction", "transaction-floor"),
)


def against_floors(table: list[dict[str, Any]]) -> list[str]:
    """Each guarded row's req/s over its floor's on the same server, in the same run:
    the share of the hand-written statements' throughput the library keeps. Unlike
    the ratio to the unguarded endpoint, it leaves out what the database round trips
    cost whoever sends them."""
    rps = {(row["server"], row["row"]): row["rps"] for row in table}
    lines = []
    for server in dict.fromkeys(row["server"] for row in table):
        for name, floor in FLOORS:
            ours, hand = rps.get((server, name)), rps.get((server, floor))
            if ours and hand:
                lines.append(f"{server}: {name} / {floor} = {ours / hand:.2f}")
    return lines


# -- the server process ------------------------------------------------------------------------


def build_app(backend: str, target: str, synchronous: str | None, cache: str | None) -> Any:
    """``/plain/...`` (no middleware) and ``/guarded/...`` (the middleware) in one
    process; ``cache``: the Redis URL of a cached store (backend ``cached``)."""
    from fastapi import Request

    from idempotence.http import current_async_transaction

    hand: Any = None
    if backend == "sqlite":
        from idempotence import AsyncSqliteStore

        store: Any = AsyncSqliteStore(target, synchronous=synchronous)
        hand = SqliteHand(target, synchronous)
    else:  # postgres, redis, cached: PostgreSQL behind Redis
        store = harness.our_store(target, cache)
        hand = harness.PgHand(target) if backend == "postgres" else None
    insert = INSERT.get(backend, "")

    def extra(plain: Any, guarded: Any, Item: Any) -> None:
        @plain.post("/plain/insert", status_code=201)
        async def hand_insert(item: Item, request: Request) -> dict[str, Any]:
            await hand.insert(insert, {"amount": item.amount, "note": request.url.path})
            return {"ok": True, "amount": item.amount}

        @guarded.post("/guarded/tx", status_code=201)
        async def in_transaction(item: Item, request: Request) -> dict[str, Any]:
            tx = current_async_transaction()
            await tx.execute(insert, {"amount": item.amount, "note": request.url.path})
            return {"ok": True, "amount": item.amount}

        @plain.post("/plain/floor-handler")
        async def floor_handler(item: Item, request: Request) -> Any:
            claim = harness.claim_params(
                backend, request.headers["idempotency-key"], request.scope["path"]
            )
            fresh = Answer(item)
            return fresh.reply(*await hand.guarded(claim, fresh, None))

        @plain.post("/plain/floor-tx")
        async def floor_tx(item: Item, request: Request) -> Any:
            write = (insert, {"amount": item.amount, "note": request.url.path})
            claim = harness.claim_params(
                backend, request.headers["idempotency-key"], request.scope["path"]
            )
            fresh = Answer(item)
            return fresh.reply(*await hand.guarded(claim, fresh, write))

        @plain.post("/plain/floor-tx-1w")
        async def floor_tx_one_write(item: Item, request: Request) -> Any:
            write = (insert, {"amount": item.amount, "note": request.url.path})
            claim = harness.claim_params(
                backend, request.headers["idempotency-key"], request.scope["path"]
            )
            fresh = Answer(item)
            return fresh.reply(*await hand.one_write(claim, fresh, write))

    if backend in ("redis", "cached"):
        # The cached store's floor: its PostgreSQL statements and Redis commands.
        by_hand: Any = (
            harness.RedisHand(target) if cache is None else harness.CachedHand(target, cache)
        )

        def key_floor(plain: Any, guarded: Any, Item: Any) -> None:
            @plain.post("/plain/floor-handler")
            async def floor_handler(item: Item, request: Request) -> Any:
                key = request.headers["idempotency-key"]
                fresh = Answer(item)
                return fresh.reply(*await by_hand.guarded(key, request.scope["path"], fresh))

        return harness.trivial_app(harness.our_guard(store), key_floor)
    return harness.trivial_app(harness.our_guard(store, ["/guarded/tx"]), extra)


class Answer:
    """The trivial endpoint's answer in a floor, made when the floor's claim took the key
    (``answer()``: the body to store) as FastAPI makes it of the dict that endpoint
    returns: its return annotation gives the route a response field, so FastAPI
    validates the dict and writes it with pydantic (``dump_json``) into a plain
    ``Response`` (fastapi/routing.py, ``use_dump_json``). A floor does the endpoint's own
    work and the guard's statements, no more and no less, so that the gap between a
    guarded row and its floor is the library's alone; a replay makes no answer."""

    __slots__ = ("item", "response")

    #: The route's response field, as FastAPI makes it once per route.
    adapter: Any = None

    def __init__(self, item: Any) -> None:
        self.item = item
        self.response: Any = None

    def __call__(self) -> bytes:
        from fastapi import Response

        adapter = Answer.adapter
        if adapter is None:
            from pydantic import TypeAdapter

            adapter = Answer.adapter = TypeAdapter(dict[str, Any])
        value = adapter.validate_python(
            {"ok": True, "amount": self.item.amount}, from_attributes=True
        )
        body: bytes = adapter.dump_json(value, by_alias=True)
        self.response = Response(body, 201, media_type="application/json")
        return body

    def reply(self, status: int, body: bytes, replayed: bool) -> Any:
        """The answer made, when the floor stored it; else the stored response (a
        replay) or the 409 the floor chose."""
        from fastapi import Response

        if self.response is not None and body is self.response.body and not replayed:
            return self.response
        headers = {"Idempotent-Replayed": "true"} if replayed else None
        return Response(body, status, headers=headers, media_type="application/json")


class SqliteHand:
    """The hand-written rows on SQLite: connections on threads of their own, one writer
    at a time, as the store has them; a claim is read first without the write lock."""

    def __init__(self, path: str, synchronous: str | None) -> None:
        from idempotence._queries import load

        self.path, self.synchronous = path, synchronous
        self.idle: list[tuple[Any, Any]] = []
        self.writer = asyncio.Lock()
        self.queries = load("sqlite")

    @contextlib.asynccontextmanager
    async def hop(self) -> Any:
        """``call(function, *args)`` runs on this request's connection's thread."""
        import sqlite3
        from concurrent.futures import ThreadPoolExecutor

        loop = asyncio.get_running_loop()
        if self.idle:
            conn, thread = self.idle.pop()
        else:
            thread = ThreadPoolExecutor(1)
            opener = lambda: sqlite3.connect(self.path, isolation_level=None, timeout=5)  # noqa: E731
            conn = await loop.run_in_executor(thread, opener)
            await loop.run_in_executor(thread, conn.execute, "PRAGMA journal_mode=WAL")
            if self.synchronous:
                pragma = f"PRAGMA synchronous={self.synchronous}"
                await loop.run_in_executor(thread, conn.execute, pragma)

        async def call(function: Any, *args: Any) -> Any:
            return await loop.run_in_executor(thread, function, conn, *args)

        try:
            yield call
        finally:
            if conn.in_transaction:
                await loop.run_in_executor(thread, conn.rollback)
            self.idle.append((conn, thread))

    async def insert(self, sql: str, params: dict[str, Any]) -> None:
        def run(conn: Any) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(sql, params)
            conn.execute("COMMIT")

        async with self.hop() as call, self.writer:
            await call(run)

    def _fetch(self, conn: Any, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
        cur = conn.execute(self.queries[name], params)
        found = cur.fetchone()
        names = [column[0] for column in cur.description or ()]
        return None if found is None else dict(zip(names, found, strict=True))

    def _claim(self, conn: Any, claim: dict[str, Any], commit: bool) -> dict[str, Any]:
        # The store's claim: the insert, and a read only for a key that exists.
        conn.execute("BEGIN IMMEDIATE")
        inserted = self._fetch(conn, "claim_insert", claim)
        row = {**inserted, "claimed": True} if inserted else self._fetch(conn, "claim_read", claim)
        if row is None:
            raise RuntimeError("the floor's claim found no row")
        if commit:
            conn.execute("COMMIT")
        return row

    def _finish(self, conn: Any, params: dict[str, Any], commit: bool) -> None:
        if self._fetch(conn, "finish", params) is None:
            raise RuntimeError("the floor's finish matched no row")
        if commit:
            conn.execute("COMMIT")

    async def guarded(
        self, claim: dict[str, Any], answer: Callable[[], bytes], write: tuple[str, Any] | None
    ) -> tuple[int, bytes, bool]:
        async with self.hop() as call:
            preview = await call(self._fetch, "claim_read", claim)
            if preview is not None:
                return harness.settled(preview)
            if write is None:  # handler mode: two short write transactions
                async with self.writer:
                    row = await call(self._claim, claim, True)
                if not row.get("claimed"):
                    return harness.settled(row)
                body = answer()
                async with self.writer:
                    await call(self._finish, harness.finish_params(row, body), False)
                return 201, body, False
            async with self.writer:  # one transaction, the write lock held throughout
                row = await call(self._claim, claim, False)
                if not row.get("claimed"):
                    return harness.settled(row)
                await call(lambda conn: conn.execute(*write).fetchall())
                body = answer()
                await call(self._finish, harness.finish_params(row, body), True)
        return 201, body, False


# -- the driver ----------------------------------------------------------------------------------


def database(
    name: str, args: argparse.Namespace, throwaways: harness.Throwaways
) -> tuple[str, list[str], harness.Meter, str]:
    """The backend, the server's arguments, a CPU meter and a description; what must
    be torn down goes on ``throwaways.stack``."""
    stack = throwaways.stack
    if name.startswith("pg"):
        if name == "pg":
            admin, what = args.postgres, "the machine's PostgreSQL as configured"
        else:
            admin = throwaways.fast_cluster()
            what = "throwaway PostgreSQL cluster, fsync=off, synchronous_commit=off"
        label = re.sub(r"[^a-z0-9]", "_", name)
        url, dbname = stack.enter_context(harness.postgres_database(admin, label))
        migrate("postgres", url)
        meter = harness.PostgresMeter(admin, dbname)
        stack.callback(meter.close)
        if name == "pg-fast+cache":
            redis, pid = throwaways.redis()
            meters = harness.Meters(meter, harness.ProcessMeter("redis", pid))
            what += "; AsyncCachedStore: replays from a throwaway redis-server"
            return "cached", ["--target", url, "--cache", f"{redis}/1"], meters, what
        return "postgres", ["--target", url], meter, what
    elif name.startswith("sqlite"):
        directory = stack.enter_context(tempfile.TemporaryDirectory())
        path = os.path.join(directory, "bench.sqlite3")
        migrate("sqlite", path)
        level = ["--synchronous", "NORMAL"] if name == "sqlite-normal" else []
        what = "SQLite file, " + ("synchronous=NORMAL" if level else "default (FULL)")
        return "sqlite", ["--target", path, *level], harness.Meter(), what
    url, pid = throwaways.redis()
    meter = harness.ProcessMeter("redis", pid)
    return "redis", ["--target", f"{url}/0"], meter, "throwaway redis-server"


def migrate(backend: str, target: str) -> None:
    """The key table and the endpoints' own table."""
    from idempotence import SqliteStore
    from idempotence.stores.postgres import PostgresStore

    store: Any = PostgresStore(target) if backend == "postgres" else SqliteStore(target)
    with store:
        store.migrate()
        with store.transaction() as tx:
            tx.execute(TABLE)
    if backend == "postgres":
        harness.in_service(target)


def app(args: argparse.Namespace) -> Any:
    """One server's app, in each of its worker processes (module-level: it pickles)."""
    return build_app(args.backend, args.target, args.synchronous, args.cache)


def chosen(found: list[harness.Row], names: list[str] | None) -> list[harness.Row]:
    """The rows named in ``names`` (all without), with the baselines they compare with."""
    if not names:
        return found
    wanted = set(names) | {row.baseline for row in found if row.name in names and row.baseline}
    return [row for row in found if row.name in wanted]


def deployed(
    deploy: str, wanted: list[str], args: argparse.Namespace, throwaways: harness.Throwaways
) -> tuple[dict[str, harness.Server], list[dict[str, Any]]]:
    """The servers of one deployment (named ``SERVER/DEPLOY``, plain ``SERVER`` for one
    process), each in a database of its own, measured in interleaved rounds and
    stopped: one deployment at a time, so no two deployments' pools are open at once."""
    servers: dict[str, harness.Server] = {}
    table_rows: list[harness.Row] = []
    with contextlib.ExitStack() as stack:
        for each in wanted:
            name = each if deploy == "1" else f"{each}/{deploy}"
            backend, arguments, meter, what = database(name, args, throwaways)
            arguments = ["--backend", backend, "--deploy", deploy, *arguments]
            port, pid = stack.enter_context(harness.app_server(__file__, arguments))
            what += f"; {harness.deploy_label(deploy)}"
            servers[name] = harness.Server(name, port, pid, meter, what)
            table_rows += chosen(rows(name, backend), args.row)
        return servers, harness.measure(servers, table_rows, args)


def main() -> None:
    def serve_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--backend", required=True)
        parser.add_argument("--target", required=True)
        parser.add_argument("--synchronous")
        parser.add_argument("--cache", help="a cached store's Redis URL")

    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--server", action="append", choices=SERVERS, help="repeatable")
        deploy = harness.deploy_option
        parser.add_argument("--deploy", action="append", type=deploy, help=harness.DEPLOY_HELP)
        parser.add_argument(
            "--row", action="append", help="only this row and its baseline (repeatable)"
        )

    args = harness.command_line(__doc__ or "", serve_options, options, app)
    if args is None:
        return
    wanted = harness.without_missing_redis(args.server or list(SERVERS), *ON_REDIS)
    servers: dict[str, harness.Server] = {}
    table: list[dict[str, Any]] = []
    deploys = list(dict.fromkeys(args.deploy or ["1"]))
    with contextlib.ExitStack() as stack:
        throwaways = harness.Throwaways(stack)
        for deploy in deploys:
            found, measured = deployed(deploy, wanted, args, throwaways)
            servers.update(found)
            table += measured
    layout = ", ".join(harness.deploy_label(deploy) for deploy in deploys)
    harness.emit(table, servers, args, harness.head(args, layout), against_floors(table))


if __name__ == "__main__":
    main()
