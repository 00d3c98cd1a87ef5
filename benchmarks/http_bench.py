"""HTTP middleware throughput: guarded endpoints against the same endpoint unguarded.

Run it from the repository root::

    .venv/bin/python benchmarks/http_bench.py                  # the full run, about 2 minutes
    .venv/bin/python benchmarks/http_bench.py --quick          # a smoke run, about 30 seconds
    .venv/bin/python benchmarks/http_bench.py --backend sqlite --seconds 3 --connections 32 --json

One uvicorn process per database serves a Starlette app with the ASGI middleware and
an async store; a load generator in another process keeps ``--connections`` keep-alive
connections busy with POSTs for ``--seconds`` per row (after a warm-up), each with a
new Idempotency-Key, and reports requests/s and p50/p99 latency. Every endpoint does
the same work, an INSERT of one row in a transaction on the store's database, and
answers 201 with a small JSON body:

``unguarded``  the endpoint is exempt (``Endpoint(..., None)``): the baseline.
``handler``    plain mode: claim, run the handler (its own transaction), store the response.
``transaction`` request-as-transaction (F3): the claim, the INSERT and the stored response
               in the handler's one transaction; the target is >= 0.8 of ``unguarded``.
``replay``     the same key again and again on ``handler``: every request is a replay.
``cached-replay`` the same on ``handler`` behind a ``CachedStore`` (Redis at ``--redis`` in
               front of the same database): every replay is one Redis GET; target >= 0.8.
``sql-floor``  no middleware and no library code: the handler runs the store's own claim
               and finish statements (from the package's queries.sql) by hand around its
               INSERT, in one transaction, with as few round trips as they can take: on
               PostgreSQL the BEGIN and the claim in one pipeline, the finish and the
               COMMIT in another; on SQLite, a thread per connection, as the store has,
               and the claim in the BEGIN's trip, the finish in the COMMIT's. So
               ``transaction`` / ``sql-floor`` is the library's own overhead, and
               ``sql-floor`` / ``unguarded`` the bound on any guard that stores a claim and
               a response in the request's transaction.

PostgreSQL comes from ``--postgres URL`` (default ``$IDEMPOTENCE_TEST_POSTGRES``, else
``postgresql://postgres@127.0.0.1:5432/postgres``); the script creates
``idempotence_bench_http_<pid>`` and drops it at the end. SQLite is a file in a
temporary directory. The rows of one database are measured in one server process,
back to back, in ``--rounds`` rounds (medians are reported), so the ratios compare
like with like. ``cpu us`` is the server process's CPU time per request (user and
system, from /proc): on a small machine the one uvicorn process is the bottleneck, so
the ratio follows it. The script measures and never judges: it exits 0 whatever the
ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

MODES = ("unguarded", "handler", "transaction", "replay", "sql-floor", "cached-replay")
PATHS = {
    "unguarded": "/unguarded",
    "handler": "/handler",
    "transaction": "/tx",
    "replay": "/handler",
    "sql-floor": "/floor",
    "cached-replay": "/cached",
}
REDIS_ENV = "IDEMPOTENCE_BENCH_REDIS"  # --redis, handed to the server process
BACKENDS = ("postgres", "sqlite")
TABLE = "CREATE TABLE IF NOT EXISTS bench_items (amount INTEGER NOT NULL, note TEXT NOT NULL)"
INSERT = {
    "postgres": "INSERT INTO bench_items (amount, note) VALUES (%(amount)s, %(note)s)",
    "sqlite": "INSERT INTO bench_items (amount, note) VALUES (:amount, :note)",
}

# -- the server -------------------------------------------------------------------------------


def build_app(backend: str, target: str) -> Any:
    """The benchmark's Starlette app (run in the server process)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from idempotence import AsyncSqliteStore
    from idempotence.http import (
        Endpoint,
        Idempotency,
        IdempotencyMiddleware,
        Policy,
        current_async_transaction,
        single_tenant,
    )

    if backend == "postgres":
        from idempotence.stores.postgres import AsyncPostgresStore

        store: Any = AsyncPostgresStore(target, max_size=20)
    else:
        store = AsyncSqliteStore(target)
    insert = INSERT[backend]

    async def own_transaction(request: Request) -> JSONResponse:
        data = await request.json()
        async with store.transaction() as tx:
            await tx.execute(insert, {"amount": data["amount"], "note": request.url.path})
        return JSONResponse({"ok": True, "amount": data["amount"]}, status_code=201)

    async def in_transaction(request: Request) -> JSONResponse:
        data = await request.json()
        tx = current_async_transaction()
        await tx.execute(insert, {"amount": data["amount"], "note": request.url.path})
        return JSONResponse({"ok": True, "amount": data["amount"]}, status_code=201)

    from idempotence._queries import load as load_queries

    floor: Any = _PgFloor(target) if backend == "postgres" else _SqliteFloor(target)
    queries = load_queries(backend)
    timeout, retention = timedelta(minutes=1), timedelta(days=1)
    durations: tuple[Any, Any] = (timeout, retention)
    if backend == "sqlite":
        durations = (timeout.total_seconds(), retention.total_seconds())

    async def sql_floor(request: Request) -> JSONResponse:
        data = await request.json()
        key = request.headers["idempotency-key"]
        claim = {
            "scope": "bench",
            "key": key,
            "method": "POST",
            "path": request.url.path,
            "fingerprint": key,
            "params": "{}",
            "flow": "http",
            "lock_timeout": durations[0],
            "retention": durations[1],
        }
        body = json.dumps({"ok": True, "amount": data["amount"]}).encode()
        finish = {
            "status": 201,
            "headers": '[["content-type", "application/json"]]',
            "body": body,
            "error": None,
            "scope": "bench",
        }
        write = {"amount": data["amount"], "note": request.url.path}
        await floor(queries, claim, (insert, write), finish)
        return JSONResponse({"ok": True, "amount": data["amount"]}, status_code=201)

    # cached-replay: the handler guarded on a CachedStore, a middleware of its own.
    from idempotence.stores.cached import AsyncCachedStore

    primary: Any = (
        AsyncPostgresStore(target, max_size=20)
        if backend == "postgres"
        else AsyncSqliteStore(target)
    )
    cached = AsyncCachedStore(primary, os.environ[REDIS_ENV], prefix=f"bench:{os.getpid()}")
    cached_app = IdempotencyMiddleware(
        Starlette(routes=[Route("/cached", own_transaction, methods=["POST"])]),
        Idempotency(store=cached, scope=single_tenant("bench-cached")),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield
        await floor.close()
        await store.close()
        async for name in cached._redis.scan_iter(match=f"bench:{os.getpid()}:*"):
            await cached._redis.delete(name)
        await cached.close()

    app = Starlette(
        routes=[
            Route("/unguarded", own_transaction, methods=["POST"]),
            Route("/handler", own_transaction, methods=["POST"]),
            Route("/tx", in_transaction, methods=["POST"]),
            Route("/floor", sql_floor, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
    config = Idempotency(
        store=store,
        scope=single_tenant("bench"),
        endpoints=[
            Endpoint("POST /unguarded", None),
            Endpoint("POST /floor", None),
            Endpoint("POST /tx", Policy(transaction=True)),
        ],
    )
    guarded = IdempotencyMiddleware(app, config)

    async def dispatch(scope: Any, receive: Any, send: Any) -> None:
        chosen = cached_app if scope.get("path") == "/cached" else guarded
        await chosen(scope, receive, send)

    return dispatch


class _PgFloor:
    """The sql-floor row on PostgreSQL: a pool like the store's, statements by hand."""

    def __init__(self, target: str) -> None:
        import psycopg_pool

        from idempotence.stores import _postgres_async, _postgres_base

        self.pool: Any = psycopg_pool.AsyncConnectionPool(
            target,
            max_size=20,
            kwargs={"autocommit": True},
            configure=_postgres_async._configure_async,
            open=False,
        )
        self.opened = False
        self.finish = _postgres_base.deferred_sql  # the finish as the store sends it

    async def __call__(
        self, queries: Any, claim: Any, write: tuple[str, Any], finish: dict[str, Any]
    ) -> None:
        from psycopg.rows import dict_row

        from idempotence.stores._ops import Query

        if not self.opened:
            await self.pool.open()
            self.opened = True
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            async with conn.pipeline():
                await conn.execute("BEGIN")
                await cur.execute(queries["claim"], claim)
            row = await cur.fetchone()
            try:
                await conn.execute(*write)
                async with conn.pipeline():
                    finish = {**finish, "id": row["id"], "token": row["lock_token"]}
                    query = Query("finish", queries["finish"], finish)
                    await conn.execute(self.finish(query), finish)
                    await conn.execute("COMMIT")
            except BaseException:
                await conn.execute("ROLLBACK")
                raise

    async def close(self) -> None:
        if self.opened:
            await self.pool.close()


class _SqliteFloor:
    """The sql-floor row on SQLite: connections on threads of their own and one writer
    at a time, as the store has them, statements by hand in three trips."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.idle: list[tuple[Any, Any]] = []
        self.writer = asyncio.Lock()

    async def __call__(
        self, queries: Any, claim: Any, write: tuple[str, Any], finish: dict[str, Any]
    ) -> None:
        import sqlite3
        from concurrent.futures import ThreadPoolExecutor

        loop = asyncio.get_running_loop()
        if self.idle:
            conn, thread = self.idle.pop()
        else:
            thread = ThreadPoolExecutor(1)
            conn = await loop.run_in_executor(
                thread, lambda: sqlite3.connect(self.path, isolation_level=None, timeout=5)
            )
            await loop.run_in_executor(thread, conn.execute, "PRAGMA journal_mode=WAL")

        def begin() -> Any:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(queries["claim_read"], claim).fetchall()
            cur = conn.execute(queries["claim_insert"], claim)
            names = [column[0] for column in cur.description]
            return dict(zip(names, cur.fetchone(), strict=True))

        def commit(row: Any) -> None:
            params = {**finish, "id": row["id"], "token": row["lock_token"]}
            if not conn.execute(queries["finish"], params).fetchall():
                raise RuntimeError("the floor's finish matched no row")
            conn.execute("COMMIT")

        try:
            async with self.writer:
                try:
                    row = await loop.run_in_executor(thread, begin)
                    await loop.run_in_executor(thread, lambda: conn.execute(*write).fetchall())
                    await loop.run_in_executor(thread, commit, row)
                except BaseException:
                    await loop.run_in_executor(thread, conn.rollback)
                    raise
        finally:
            self.idle.append((conn, thread))

    async def close(self) -> None:
        for conn, thread in self.idle:
            thread.submit(conn.close)  # on the thread that opened it
            thread.shutdown(wait=True)


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    app = build_app(args.backend, args.target)
    # Not uvicorn's fd= option: it wraps the descriptor as an AF_UNIX socket, so asyncio
    # never sets TCP_NODELAY on the connections, and Nagle's algorithm meets delayed
    # ACKs for 40 ms per response. socket(fileno=) reads the real family and protocol.
    sock = socket.socket(fileno=args.fd)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


# -- the load generator -------------------------------------------------------------------------


async def _connection_loop(
    port: int, path: str, keys: Iterator[str], until: float, latencies: list[float]
) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"amount": 100}'
    errors = 0
    try:
        while time.perf_counter() < until:
            head = (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nIdempotency-Key: {next(keys)}\r\n\r\n"
            )
            started = time.perf_counter()
            writer.write(head.encode() + body)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if int(status_line.split()[1]) != 201:
                errors += 1
    finally:
        writer.close()
    return errors


async def _load(args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"{os.getpid()}-{time.monotonic_ns()}"

    # One counter for the warm-up and the measured run, so that no key of the run
    # was already used in the warm-up (which would make it a cheap replay).
    counters: dict[int, itertools.count[int]] = {}

    def unique(worker: int) -> Iterator[str]:
        counter = counters.setdefault(worker, itertools.count(1))
        while True:
            yield f"{prefix}-{worker}-{next(counter)}"

    def same(worker: int) -> Iterator[str]:
        while True:
            yield f"replay-{worker}"

    keys = same if args.replay else unique
    warm: list[float] = []
    if args.warmup > 0:
        until = time.perf_counter() + args.warmup
        await asyncio.gather(
            *(
                _connection_loop(args.port, args.path, keys(w), until, warm)
                for w in range(args.connections)
            )
        )
    latencies: list[float] = []
    started = time.perf_counter()
    until = started + args.seconds
    errors = await asyncio.gather(
        *(
            _connection_loop(args.port, args.path, keys(w), until, latencies)
            for w in range(args.connections)
        )
    )
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else 0.0,
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] if latencies else 0.0,
        "errors": sum(errors),
        "warmup_requests": len(warm),
    }


def load(args: argparse.Namespace) -> None:
    print(json.dumps(asyncio.run(_load(args))))


# -- the driver -----------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_database(admin_url: str) -> Iterator[str]:
    import psycopg
    from psycopg import conninfo
    from psycopg import sql as pgsql

    name = f"idempotence_bench_http_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        yield conninfo.make_conninfo(admin_url, dbname=name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            drop = pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            admin.execute(drop.format(pgsql.Identifier(name)))


class _Delay:
    """A TCP proxy on 127.0.0.1 that holds every chunk ``seconds`` before passing it on,
    each way: a database across a network, for ``--db-delay-ms``. Chunks sent back to
    back arrive back to back, as on a real link (each is due at its arrival time plus
    the delay), so a pipeline keeps what it saves."""

    def __init__(self, upstream: tuple[str, int], seconds: float) -> None:
        import threading

        self.upstream, self.seconds = upstream, seconds
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        import queue
        import threading

        due: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

        def deliver() -> None:
            with contextlib.suppress(OSError):
                while (item := due.get())[1]:
                    time.sleep(max(0.0, item[0] - time.perf_counter()))
                    sink.sendall(item[1])
                sink.shutdown(socket.SHUT_WR)

        threading.Thread(target=deliver, daemon=True).start()
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                due.put((time.perf_counter() + self.seconds, data))
        due.put((0.0, b""))

    def close(self) -> None:
        self.listener.close()


@contextlib.contextmanager
def delayed(admin_url: str, milliseconds: float) -> Iterator[str]:
    """``admin_url`` through a :class:`_Delay` proxy (unchanged for 0 ms)."""
    from psycopg import conninfo

    if milliseconds <= 0:
        yield admin_url
        return
    params = conninfo.conninfo_to_dict(admin_url)
    upstream = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    proxy = _Delay(upstream, milliseconds / 1000)
    try:
        yield conninfo.make_conninfo(admin_url, host="127.0.0.1", port=proxy.port)
    finally:
        proxy.close()


@contextlib.contextmanager
def database(backend: str, admin_url: str) -> Iterator[str]:
    from idempotence import SqliteStore

    if backend == "postgres":
        from idempotence.stores.postgres import PostgresStore

        with postgres_database(admin_url) as url:
            with PostgresStore(url) as store:
                store.migrate()
                with store.transaction() as tx:
                    tx.execute(TABLE)
            yield url
    else:
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "bench.sqlite3")
            with SqliteStore(path) as store:
                store.migrate()
                with store.transaction() as tx:
                    tx.execute(TABLE)
            yield path


def _cpu_seconds(pid: int) -> float | None:
    """User and system CPU time of a process so far (Linux), else None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def server(backend: str, target: str) -> Iterator[tuple[int, int]]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    command = [sys.executable, __file__, "serve", "--backend", backend, "--target", target]
    command += ["--fd", str(sock.fileno())]
    process = subprocess.Popen(command, pass_fds=[sock.fileno()])
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.05)
        yield port, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        sock.close()


def run_load(
    server: tuple[int, int], mode: str, args: argparse.Namespace, warmup: float
) -> dict[str, Any]:
    port, pid = server
    command = [sys.executable, __file__, "load", "--port", str(port), "--path", PATHS[mode]]
    command += ["--seconds", str(args.seconds), "--warmup", str(warmup)]
    command += ["--connections", str(args.connections)]
    if mode.endswith("replay"):
        command.append("--replay")
    before = _cpu_seconds(pid)
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    after = _cpu_seconds(pid)
    result = dict(json.loads(output))
    served = result["requests"] + result["warmup_requests"]
    cpu = None if before is None or after is None or not served else (after - before) / served
    result["cpu_us"] = None if cpu is None else 1e6 * cpu
    return result


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for backend in args.backend or BACKENDS:
        with (
            delayed(args.postgres, args.db_delay_ms) as admin_url,
            database(backend, admin_url) as target,
            server(backend, target) as serving,
        ):
            rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
            for number in range(args.rounds):
                # Alternate the order so no mode always runs on a warmer (or fuller) table.
                order = MODES if number % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    warmup = args.warmup if number == 0 else args.warmup / 2
                    rounds[mode].append(run_load(serving, mode, args, warmup))
            base = statistics.median(r["rps"] for r in rounds["unguarded"])
            for mode in MODES:
                results = rounds[mode]
                rps = statistics.median(r["rps"] for r in results)
                rows.append(
                    {
                        "backend": backend,
                        "mode": mode,
                        "rps": rps,
                        "p50_ms": statistics.median(r["p50_ms"] for r in results),
                        "p99_ms": statistics.median(r["p99_ms"] for r in results),
                        "ratio": rps / base if base else 0.0,
                        "cpu_us": _median_or_none(r["cpu_us"] for r in results),
                        # Rounds that disagree mean the server drifted (a table that
                        # slows down as it grows, say), not noise to average away.
                        "spread": (max(r["rps"] for r in results) - min(r["rps"] for r in results))
                        / rps
                        if rps
                        else 0.0,
                        "errors": sum(r["errors"] for r in results),
                        "rounds": results,
                    }
                )
    return rows


def _median_or_none(values: Iterator[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    delay = f"; PostgreSQL {args.db_delay_ms:g} ms away each way" if args.db_delay_ms else ""
    print(
        f"uvicorn (1 process, asyncio, h11) on 127.0.0.1; {args.connections} keep-alive "
        f"connections; {args.seconds:g} s per row x {args.rounds} rounds (medians){delay}"
    )
    columns = ("req/s", "p50 ms", "p99 ms", "ratio", "errors", "cpu us", "spread")
    header = f"{'backend':<9} {'mode':<13} " + " ".join(f"{name:>8}" for name in columns)
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['backend']:<9} {row['mode']:<13} {row['rps']:>8.0f} {row['p50_ms']:>8.2f} "
            f"{row['p99_ms']:>8.2f} {row['ratio']:>8.2f} {row['errors']:>8} "
            + ("       -" if row["cpu_us"] is None else f"{row['cpu_us']:>8.0f}")
            + f" {100 * row['spread']:>7.0f}%"
        )
    print(
        "ratio: req/s over the unguarded endpoint's; target for 'transaction' and "
        "'cached-replay': >= 0.80"
    )
    print("spread: (fastest - slowest round) / median; a large one means the rows drifted")
    for backend in dict.fromkeys(row["backend"] for row in rows):
        rps = {row["mode"]: row["rps"] for row in rows if row["backend"] == backend}
        if rps.get("sql-floor") and "transaction" in rps:
            print(
                f"{backend}: transaction / sql-floor = {rps['transaction'] / rps['sql-floor']:.2f}"
                " (the library's own overhead over the same statements by hand)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    serving = sub.add_parser("serve", help="(internal) run the benchmark server")
    serving.add_argument("--backend", choices=BACKENDS, required=True)
    serving.add_argument("--target", required=True)
    serving.add_argument("--fd", type=int, required=True)
    loading = sub.add_parser("load", help="(internal) run the load generator")
    loading.add_argument("--port", type=int, required=True)
    loading.add_argument("--path", required=True)
    loading.add_argument("--seconds", type=float, default=5.0)
    loading.add_argument("--warmup", type=float, default=1.0)
    loading.add_argument("--connections", type=int, default=16)
    loading.add_argument("--replay", action="store_true")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="repeatable")
    env = os.environ.get("IDEMPOTENCE_TEST_POSTGRES", "")
    parser.add_argument(
        "--postgres",
        # The test suite's variable may also say "throwaway" or "embedded": not a URL.
        default=env
        if env.startswith("postgres")
        else "postgresql://postgres@127.0.0.1:5432/postgres",
    )
    parser.add_argument(
        "--db-delay-ms",
        type=float,
        default=0.0,
        help="hold PostgreSQL traffic this long each way (a database across a network)",
    )
    parser.add_argument(
        "--redis", default="redis://127.0.0.1:6379/0", help="for cached-replay's CachedStore"
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="per row, per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="a ~30 s smoke run")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    if args.command == "serve":
        serve(args)
        return
    if args.command == "load":
        load(args)
        return
    if args.quick:
        args.seconds, args.rounds, args.warmup = 1.0, 1, 0.5
    os.environ[REDIS_ENV] = args.redis
    rows = measure(args)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows, args)


if __name__ == "__main__":
    main()
