"""What a guarded request costs the app's process, counted, not timed.

Run it from the repository root::

    .venv/bin/python benchmarks/profile_request.py           # instructions/request (valgrind)
    .venv/bin/python benchmarks/profile_request.py --quick   # a smoke run, no valgrind
    .venv/bin/python benchmarks/profile_request.py --profile pg-handler   # cProfile's top
    .venv/bin/python benchmarks/profile_request.py --concurrency 16 --cpu pg-handler
    .venv/bin/python benchmarks/profile_request.py --trips --throwaway pg-transaction pg-tx-floor

The requests go in process, through ``httpx.AsyncClient`` on an ``ASGITransport``, to a
Starlette app guarded by :class:`~idempotence.http.IdempotencyMiddleware`, each with a
new Idempotency-Key (a replay row sends one key again and again). No server and no
load generator share the process, so what is counted is the app's work alone; the
database server's is not counted.

Each row is counted in two runs of a child process under ``valgrind --tool=callgrind``,
with N and 3N requests after the same warm-up: the difference of their instruction
counts over 2N is the instructions per request, free of the start-up's. A row's
``added`` subtracts its baseline's instructions per request (measured the same way in
the same run): the same endpoint without the middleware (``trivial``), or, for
request-as-transaction, the endpoint doing its one INSERT in a transaction of its own
(``insert``). ``pg-floor`` is the handler-mode floor: the trivial endpoint running the
store's own claim and finish statements by hand on a psycopg pool, no library code;
``pg-tx-floor`` and ``pg-tx-floor-1w`` the request-as-transaction floors (against
``insert``), http_bench.py's hand code (``_harness.PgHand``): BEGIN+claim in one
pipeline, the INSERT, finish+COMMIT in another; and the key row written once (BEGIN, a
transaction-scoped advisory lock and a read of the key in one pipeline, the INSERT, the
finished key row inserted with the COMMIT);
``redis-floor`` the same with the Redis store's two scripts, sent by EVALSHA on a bare
asyncio connection (``_harness.RedisHand``: no redis-py).
Instruction counts are the same however busy the machine is, so two
runs on a shared machine compare. ``--trips`` counts instead what each PostgreSQL row
sends the server per request: round trips (a ``Sync`` or a simple ``Query``: the
client then waits) and statements (``Execute`` and ``Query`` messages), through a
counting proxy (``tests.support.roundtrips``), and the WAL the server wrote, over N
and 3N requests as above (WAL is the whole cluster's: with ``--throwaway`` the rows run
on a throwaway cluster of their own, fsync off, where it is theirs alone).
``--cpu`` reports CPU microseconds per request instead (process time, noisier), with
``--concurrency`` clients at once.

PostgreSQL comes from ``--postgres URL`` (default ``$IDEMPOTENCE_TEST_POSTGRES``, else
``postgresql://postgres@127.0.0.1:5432/postgres``); the script creates
``idempotence_bench_profile_<pid>``, seeds it with finished keys and ANALYZEs it (a
table in service, as in the other benchmarks), and drops it at the end. SQLite is a
file in a temporary directory, at its default durability. Redis is a throwaway ``redis-server`` (no
persistence) on a free port: ``redis-*`` rows run on ``AsyncRedisStore``, ``cached-*``
rows on ``AsyncCachedStore`` (the PostgreSQL store with that Redis in front of it). The
script measures and never judges.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

#: row -> (backend, endpoint path, baseline row or None, replay)
ROWS: dict[str, tuple[str, str, str | None, bool]] = {
    "pg-trivial": ("postgres", "/trivial", None, False),
    "pg-insert": ("postgres", "/insert", None, False),
    "pg-handler": ("postgres", "/handler", "pg-trivial", False),
    "pg-transaction": ("postgres", "/tx", "pg-insert", False),
    "pg-replay": ("postgres", "/handler", "pg-trivial", True),
    "pg-floor": ("postgres", "/floor", "pg-trivial", False),
    "pg-tx-floor": ("postgres", "/tx-floor", "pg-insert", False),
    "pg-tx-floor-1w": ("postgres", "/tx-floor-1w", "pg-insert", False),
    "sqlite-trivial": ("sqlite", "/trivial", None, False),
    "sqlite-handler": ("sqlite", "/handler", "sqlite-trivial", False),
    "sqlite-replay": ("sqlite", "/handler", "sqlite-trivial", True),
    "redis-trivial": ("redis", "/trivial", None, False),
    "redis-handler": ("redis", "/handler", "redis-trivial", False),
    "redis-replay": ("redis", "/handler", "redis-trivial", True),
    "redis-floor": ("redis", "/floor", "redis-trivial", False),
    "cached-trivial": ("cached", "/trivial", None, False),
    "cached-handler": ("cached", "/handler", "cached-trivial", False),
    "cached-replay": ("cached", "/handler", "cached-trivial", True),
}
TABLE = "CREATE TABLE IF NOT EXISTS profile_items (amount INTEGER NOT NULL, note TEXT NOT NULL)"
INSERT = {
    "postgres": "INSERT INTO profile_items (amount, note) VALUES (%(amount)s, %(note)s)",
    "sqlite": "INSERT INTO profile_items (amount, note) VALUES (:amount, :note)",
}


# -- the app ----------------------------------------------------------------------------------


def build_app(backend: str, target: str) -> tuple[Any, Any, Any]:
    """The Starlette app, guarded, its store, and what to close at the end (the floors)."""
    from _harness import claim_params
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
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

    store: Any
    if backend == "postgres":
        from idempotence.stores.postgres import AsyncPostgresStore

        store = AsyncPostgresStore(target, max_size=20)
    elif backend == "redis":
        from idempotence.stores.redis import AsyncRedisStore

        store = AsyncRedisStore(target)
    elif backend == "cached":
        from idempotence import AsyncCachedStore
        from idempotence.stores.postgres import AsyncPostgresStore

        database, cache = target.rsplit("|", 1)
        store = AsyncCachedStore(AsyncPostgresStore(database, max_size=20), cache)
    else:
        store = AsyncSqliteStore(target)
    insert = INSERT.get(backend, INSERT["postgres"])

    async def trivial(request: Request) -> JSONResponse:
        data = await request.json()
        return JSONResponse({"ok": True, "amount": data["amount"]}, status_code=201)

    async def own_transaction(request: Request) -> JSONResponse:
        data = await request.json()
        async with store.transaction() as tx:
            await tx.execute(insert, {"amount": data["amount"], "note": "x"})
        return JSONResponse({"ok": True, "amount": data["amount"]}, status_code=201)

    async def in_transaction(request: Request) -> JSONResponse:
        data = await request.json()
        tx = current_async_transaction()
        await tx.execute(insert, {"amount": data["amount"], "note": "x"})
        return JSONResponse({"ok": True, "amount": data["amount"]}, status_code=201)

    floor = _floor(backend, target)
    hand = _tx_floor(backend, target)

    async def by_hand(request: Request) -> JSONResponse:
        data = await request.json()
        await floor(request.headers["idempotency-key"])
        return JSONResponse({"ok": True, "amount": data["amount"]}, status_code=201)

    def tx_by_hand(one_write: bool) -> Any:
        # The request-as-transaction floors: _harness.PgHand's BEGIN+claim, INSERT,
        # finish+COMMIT (or the key row written once), answering what the store keeps:
        # the endpoint's own answer (a JSONResponse, as the guarded one's), made once
        # the claim took the key.
        async def endpoint(request: Request) -> Response:
            data = await request.json()
            key, path = request.headers["idempotency-key"], request.scope["path"]
            claim = claim_params("postgres", key, path)
            write = (insert, {"amount": data["amount"], "note": "x"})
            made: list[JSONResponse] = []

            def answer() -> bytes:
                made.append(JSONResponse({"ok": True, "amount": data["amount"]}, status_code=201))
                return made[0].body

            run = hand.one_write if one_write else hand.guarded
            status, body, _ = await run(claim, answer, write)
            if made and body is made[0].body:
                return made[0]
            return Response(body, status, media_type="application/json")

        return endpoint

    app = Starlette(
        routes=[
            Route("/floor", by_hand, methods=["POST"]),
            Route("/trivial", trivial, methods=["POST"]),
            Route("/insert", own_transaction, methods=["POST"]),
            Route("/handler", trivial, methods=["POST"]),
            Route("/tx", in_transaction, methods=["POST"]),
            Route("/tx-floor", tx_by_hand(False), methods=["POST"]),
            Route("/tx-floor-1w", tx_by_hand(True), methods=["POST"]),
        ]
    )
    config = Idempotency(
        store=store,
        scope=single_tenant("profile"),
        endpoints=[
            Endpoint("POST /trivial", None),
            Endpoint("POST /insert", None),
            Endpoint("POST /floor", None),
            Endpoint("POST /tx-floor", None),
            Endpoint("POST /tx-floor-1w", None),
            # Request-as-transaction needs a SQL store's transaction.
            *([] if backend == "redis" else [Endpoint("POST /tx", Policy(transaction=True))]),
        ],
    )
    closing = [close for close in (floor, hand) if close is not None]
    return IdempotencyMiddleware(app, config), store, closing


def _tx_floor(backend: str, target: str) -> Any:
    """The request-as-transaction floors on PostgreSQL: http_bench.py's own hand code
    (``_harness.PgHand``), its pool opened at the first request."""
    if backend != "postgres":
        return None
    from _harness import PgHand

    return PgHand(target)


def _floor(backend: str, target: str) -> Any:
    """The handler-mode floor: the store's own claim and finish statements (from the
    package's queries.sql), by hand on a psycopg pool, no library code around them;
    on Redis, its claim and finish scripts by hand (``_harness.RedisHand``)."""
    if backend == "redis":
        return _redis_floor(target)
    if backend != "postgres":
        return None
    import psycopg_pool
    from psycopg.rows import dict_row

    from idempotence._queries import load

    queries = load("postgres")
    pool: Any = psycopg_pool.AsyncConnectionPool(
        target, min_size=1, max_size=20, kwargs={"autocommit": True}, open=False
    )
    finish = {"status": 201, "headers": "[]", "body": b"{}", "error": None, "scope": "profile"}

    async def statements(key: str) -> None:
        if pool.closed:
            await pool.open()
        claim = {
            "scope": "profile",
            "key": key,
            "method": "POST",
            "path": "/floor",
            "fingerprint": key,
            "params": "{}",
            "flow": "http",
            "lock_timeout": timedelta(seconds=30),
            "retention": timedelta(days=1),
        }
        async with pool.connection() as conn:
            cur = await conn.cursor(row_factory=dict_row).execute(queries["claim"], claim)
            row = await cur.fetchone()
        async with pool.connection() as conn:
            params = {**finish, "key": row["key"], "id": row["id"], "token": row["lock_token"]}
            await (await conn.execute(queries["finish"], params)).fetchall()

    async def close() -> None:
        if not pool.closed:
            await pool.close()

    statements.close = close  # type: ignore[attr-defined]
    return statements


def _redis_floor(target: str) -> Any:
    from _harness import RedisHand

    hand = RedisHand(target)

    async def scripts(key: str) -> None:
        status, _, _ = await hand.guarded(key, "/floor", lambda: b'{"ok": true}')
        if status != 201:
            raise RuntimeError(f"the Redis floor did not claim {key!r}: {status}")

    async def close() -> None:
        await hand.close()

    scripts.close = close  # type: ignore[attr-defined]
    return scripts


async def _requests(app: Any, path: str, replay: bool, counts: list[int], concurrency: int) -> Any:
    """Send ``counts[0]`` requests (the warm-up), then each further count in turn;
    yield after each batch (an async generator of nothing but pauses)."""
    import httpx

    transport = httpx.ASGITransport(app=app)
    body = json.dumps({"amount": 42}).encode()
    fixed = str(uuid.uuid4())
    async with httpx.AsyncClient(transport=transport, base_url="http://profile") as client:

        async def one() -> None:
            key = fixed if replay else str(uuid.uuid4())
            headers = {"idempotency-key": key, "content-type": "application/json"}
            response = await client.post(path, content=body, headers=headers)
            if response.status_code != 201:
                raise RuntimeError(f"{path} answered {response.status_code}: {response.text}")

        async def batch(n: int) -> None:
            per, extra = divmod(n, concurrency)

            async def worker(count: int) -> None:
                for _ in range(count):
                    await one()

            await asyncio.gather(*(worker(per + (i < extra)) for i in range(concurrency)))

        for count in counts:
            await batch(count)
            yield


async def _child(args: argparse.Namespace) -> None:
    backend, path, _, replay = ROWS[args.row]
    app, store, closing = build_app(backend, args.target)
    try:
        steps = _requests(app, path, replay, [args.warmup, args.requests], args.concurrency)
        await anext(steps)  # the warm-up
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        start = time.process_time()
        if profiler is not None:
            profiler.enable()
        await anext(steps)
        if profiler is not None:
            profiler.disable()
        cpu = time.process_time() - start
        with contextlib.suppress(StopAsyncIteration):
            await anext(steps)
        if profiler is not None:
            stats = pstats.Stats(profiler, stream=sys.stdout)
            stats.sort_stats(args.sort).print_stats(args.top)
        print(json.dumps({"row": args.row, "cpu_us": cpu / max(args.requests, 1) * 1e6}))
    finally:
        await store.close()
        for each in closing:
            await each.close()


# -- the databases ----------------------------------------------------------------------------


@contextlib.contextmanager
def targets(admin_url: str, backends: set[str]) -> Iterator[dict[str, str]]:
    """A fresh, migrated database per backend, with the app's table."""
    found: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        if "postgres" in backends or "cached" in backends:
            found["postgres"] = stack.enter_context(_postgres(admin_url))
        if "redis" in backends or "cached" in backends:
            from _harness import throwaway_redis

            redis_url, _ = stack.enter_context(throwaway_redis())
            found["redis"] = f"{redis_url}/0"
            if "cached" in backends:
                found["cached"] = f"{found['postgres']}|{redis_url}/1"
        if "sqlite" in backends:
            folder = stack.enter_context(tempfile.TemporaryDirectory())
            path = os.path.join(folder, "profile.db")
            from idempotence import SqliteStore

            with SqliteStore(path) as store:
                store.migrate()
            import sqlite3

            with contextlib.closing(sqlite3.connect(path)) as conn:
                conn.execute(TABLE)
                conn.commit()
            found["sqlite"] = path
        yield found


@contextlib.contextmanager
def _postgres(admin_url: str) -> Iterator[str]:
    """A migrated database in service (seeded and analyzed, as the other benchmarks'),
    with the app's table; dropped at the end."""
    import psycopg
    from _harness import in_service, postgres_database

    from idempotence.stores.postgres import PostgresStore

    with postgres_database(admin_url, "profile") as (url, _):
        with PostgresStore(url) as store:
            store.migrate()
        in_service(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(TABLE)
        yield url


# -- the parent -------------------------------------------------------------------------------


def _child_command(row: str, target: str, args: argparse.Namespace, requests: int) -> list[str]:
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        row,
        "--target",
        target,
        "--warmup",
        str(args.warmup),
        "--requests",
        str(requests),
        "--concurrency",
        str(args.concurrency),
    ]


def callgrind(out: str, command: list[str], *options: str) -> list[str]:
    """``command`` under callgrind, instructions only, counts written to ``out`` (and
    to ``out.N`` for each dump that ``options`` ask for); instruction_guard.py's too."""
    return [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        *options,
        "--dump-instr=no",
        "--compress-strings=no",
        *command,
    ]


def total(text: str) -> int:
    """The instructions a callgrind file counted (``summary``, its header's, comes
    before ``totals``, the sum of its cost lines)."""
    found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    if found is None:
        raise RuntimeError("callgrind wrote no totals")
    return int(found.group(1))


def instructions(row: str, target: str, args: argparse.Namespace, requests: int) -> int:
    """The instructions a child process runs, whole (start-up included)."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        command = callgrind(out, _child_command(row, target, args, requests))
        subprocess.run(command, check=True, capture_output=True, text=True)
        with open(out) as f:
            return total(f.read())


def per_request(row: str, target: str, args: argparse.Namespace) -> float:
    small = instructions(row, target, args, args.requests)
    large = instructions(row, target, args, 3 * args.requests)
    return (large - small) / (2 * args.requests)


def trips(row: str, target: str, args: argparse.Namespace) -> tuple[float, float, float]:
    """Round trips and statements per request to PostgreSQL, counted by a proxy in
    front of the server (``tests.support.roundtrips``), and the WAL the server wrote
    (the whole cluster's: ours alone on a cluster of its own, ``--throwaway``), over
    runs of N and 3N requests: the difference over 2N, free of the start-up's (the
    pools' connections and their session settings)."""
    import psycopg
    from _harness import use_repo

    use_repo()
    from tests.support.roundtrips import round_trips

    def wal() -> int:
        with psycopg.connect(target, autocommit=True) as conn:
            found = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
            return int(found[0]) if found else 0

    counted = []
    for requests in (args.requests, 3 * args.requests):
        with round_trips(target) as proxy:
            command = _child_command(row, proxy.url, args, requests)
            before = wal()
            subprocess.run(command, check=True, capture_output=True, text=True)
            counted.append((proxy.count, proxy.statements, wal() - before))
    n = 2 * args.requests
    small, large = counted
    return (
        (large[0] - small[0]) / n,
        (large[1] - small[1]) / n,
        (large[2] - small[2]) / n,
    )


def cpu(row: str, target: str, args: argparse.Namespace) -> float:
    done = subprocess.run(
        _child_command(row, target, args, args.requests),
        check=True,
        capture_output=True,
        text=True,
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["cpu_us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rows", nargs="*", help=f"rows to measure (default all): {list(ROWS)}")
    parser.add_argument("--requests", type=int, default=150, help="N (the runs send N and 3N)")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=1, help="clients at once")
    parser.add_argument("--cpu", action="store_true", help="CPU us/request, not instructions")
    parser.add_argument("--profile", metavar="ROW", help="print cProfile's top functions")
    parser.add_argument("--sort", default="tottime", help="the profile's order (pstats key)")
    parser.add_argument("--top", type=int, default=30, help="the profile's length")
    parser.add_argument("--quick", action="store_true", help="a few requests, CPU only")
    parser.add_argument(
        "--trips", action="store_true", help="PostgreSQL round trips, statements, WAL/request"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--throwaway",
        action="store_true",
        help="PostgreSQL on a throwaway cluster of its own (fsync off): WAL is ours alone",
    )
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "IDEMPOTENCE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.row = args.child
        args.profile = bool(os.environ.get("PROFILE_REQUEST_CPROFILE"))
        asyncio.run(_child(args))
        return
    if args.quick:
        args.cpu, args.requests, args.warmup = True, 20, 5
    rows = [args.profile] if args.profile else (args.rows or list(ROWS))
    for row in rows:
        if row not in ROWS:
            parser.error(f"unknown row {row!r}: one of {list(ROWS)}")
    if args.trips:
        rows = [row for row in rows if ROWS[row][0] == "postgres"]
    if not (args.cpu or args.profile or args.trips) and shutil.which("valgrind") is None:
        parser.error("valgrind is not installed: apt-get install valgrind, or use --cpu")
    wanted = set(rows) | {ROWS[row][2] for row in rows if ROWS[row][2] is not None}
    wanted_rows = [row for row in ROWS if row in wanted]
    with contextlib.ExitStack() as stack:
        admin = args.postgres
        if args.throwaway:
            from _harness import fast_cluster

            admin = stack.enter_context(fast_cluster())
        found = stack.enter_context(targets(admin, {ROWS[row][0] for row in wanted_rows}))
        if args.profile:
            env = {**os.environ, "PROFILE_REQUEST_CPROFILE": "1"}
            row = args.profile
            command = _child_command(row, found[ROWS[row][0]], args, args.requests)
            command += ["--sort", args.sort, "--top", str(args.top)]
            subprocess.run(command, check=True, env=env)
            return
        if args.trips:
            counts = {row: trips(row, found[ROWS[row][0]], args) for row in rows}
            print(f"{'row':<16} {'trips/request':>14} {'statements/request':>19} {'WAL B':>8}")
            for row, (round_trips, statements, wal) in counts.items():
                print(f"{row:<16} {round_trips:>14.2f} {statements:>19.2f} {wal:>8,.0f}")
            return
        measure = cpu if args.cpu else per_request
        got = {row: measure(row, found[ROWS[row][0]], args) for row in wanted_rows}
    unit = "cpu us" if args.cpu else "instr"
    results = []
    for row in rows:
        baseline = ROWS[row][2]
        added = None if baseline is None else got[row] - got[baseline]
        results.append({"row": row, unit: got[row], "baseline": baseline, "added": added})
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'row':<16} {unit + '/request':>16} {'baseline':<16} {'added':>12}")
    for result in results:
        added = "" if result["added"] is None else f"{result['added']:,.0f}"
        print(
            f"{result['row']:<16} {result[unit]:>16,.0f} {result['baseline'] or '':<16} {added:>12}"
        )


if __name__ == "__main__":
    main()
