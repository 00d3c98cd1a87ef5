"""Driver cost (issue 13, item 6): the store's claim and finish statements issued with
psycopg and with asyncpg, side by side, and the client CPU each spends per round trip.

Run it from the repository root::

    .venv/bin/python benchmarks/drivers.py            # 3 rounds of 3 s per row, about a minute
    .venv/bin/python benchmarks/drivers.py --quick    # a smoke run, about 15 seconds
    .venv/bin/python benchmarks/drivers.py --postgres-kind machine --json

asyncpg is installed into ``benchmarks/.deps`` by ``bash benchmarks/setup.sh``, never
into the package's dependencies. Both drivers run on uvloop, in this one process, each
on its own connections to one database (by default on a throwaway cluster with
fsync=off and synchronous_commit=off, so the disk does not set the pace; ``--postgres-kind
machine`` uses ``--postgres`` as configured), its key table seeded with finished keys and
ANALYZEd, as a table in service is. Rows, for each driver at 1 and at
``--tasks`` concurrent tasks (one connection each):

``select``  ``SELECT 1``: the driver's bare round trip
``pair``    the store's ``claim`` of a new key, then its ``finish`` (two round trips),
            with the exact SQL of the package's queries.sql (asyncpg gets it with
            ``$n`` placeholders; both drivers prepare it, as the store's psycopg does
            after a few runs)

``client us/trip`` is this process's CPU time (user + system) per round trip: what the
app server pays the driver for each statement; ``server us/trip`` the PostgreSQL
backends'. The rounds alternate the drivers' order; medians are shown.
"""

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import _harness as harness

DRIVERS = ("psycopg", "asyncpg")
KINDS = ("select", "pair")
PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def positional(sql: str) -> tuple[str, list[str]]:
    """``%(name)s`` placeholders as asyncpg's ``$n``, and the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return PLACEHOLDER.sub(number, sql), names


def claim_params(key: str) -> dict[str, Any]:
    return {
        "scope": "bench",
        "key": key,
        "method": "POST",
        "path": "/drivers",
        "fingerprint": key,
        "params": "{}",
        "flow": "http",
        "lock_timeout": timedelta(seconds=10),
        "retention": timedelta(days=1),
    }


def finish_params(row: Any) -> dict[str, Any]:
    return {
        "status": 201,
        "headers": '[["content-type", "application/json"]]',
        "body": b'{"ok": true}',
        "error": None,
        "scope": "bench",
        "key": row["key"],
        "id": row["id"],
        "token": row["lock_token"],
    }


class Psycopg:
    def __init__(self, url: str, queries: dict[str, str]) -> None:
        self.url, self.queries = url, queries

    async def connect(self) -> Any:
        import psycopg
        from psycopg.rows import dict_row

        return await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )

    async def select(self, conn: Any, key: str) -> None:
        await (await conn.execute("SELECT 1")).fetchone()

    async def pair(self, conn: Any, key: str) -> None:
        row = await (await conn.execute(self.queries["claim"], claim_params(key))).fetchone()
        cur = await conn.execute(self.queries["finish"], finish_params(row))
        if await cur.fetchone() is None:
            raise RuntimeError("the finish matched no row")


class Asyncpg:
    def __init__(self, url: str, queries: dict[str, str]) -> None:
        self.url = url
        self.claim, self.claim_names = positional(queries["claim"])
        self.finish, self.finish_names = positional(queries["finish"])

    async def connect(self) -> Any:
        import asyncpg

        return await asyncpg.connect(self.url)  # prepares and caches every statement

    async def select(self, conn: Any, key: str) -> None:
        await conn.fetchrow("SELECT 1")

    async def pair(self, conn: Any, key: str) -> None:
        params = claim_params(key)
        row = await conn.fetchrow(self.claim, *(params[n] for n in self.claim_names))
        params = finish_params(row)
        if await conn.fetchrow(self.finish, *(params[n] for n in self.finish_names)) is None:
            raise RuntimeError("the finish matched no row")


async def run_row(
    driver: Any, kind: str, tasks: int, seconds: float, meter: harness.Meter, run: str
) -> dict[str, float]:
    connections = [await driver.connect() for _ in range(tasks)]
    operation: Callable[[Any, str], Awaitable[None]] = getattr(driver, kind)
    try:
        for number, conn in enumerate(connections):  # warm: prepared statements, caches
            for warm in range(8):
                await operation(conn, f"{run}-warm-{number}-{warm}")
        done = [0] * tasks
        until = time.perf_counter() + seconds

        async def loop(number: int, conn: Any) -> None:
            while time.perf_counter() < until:
                done[number] += 1
                await operation(conn, f"{run}-{number}-{done[number]}")

        db_before, cpu_before, started = meter.snapshot(), time.process_time(), time.perf_counter()
        await asyncio.gather(*(loop(n, conn) for n, conn in enumerate(connections)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_before
        db_after = meter.snapshot()
    finally:
        for conn in connections:
            await conn.close()
    trips = sum(done) * (2 if kind == "pair" else 1)
    server = harness.Meter.used(db_before.get("db", {}), db_after.get("db", {}))
    return {
        "ops": sum(done) / elapsed,
        "client_us": 1e6 * cpu / trips,
        "server_us": 1e6 * server / trips if db_after else float("nan"),
    }


async def measure(url: str, meter: harness.Meter, args: argparse.Namespace) -> list[dict[str, Any]]:
    from idempotence._queries import load

    queries = load("postgres")
    drivers = {"psycopg": Psycopg(url, queries), "asyncpg": Asyncpg(url, queries)}
    rows = [(d, k, t) for k in KINDS for t in sorted({1, args.tasks}) for d in DRIVERS]
    results: dict[tuple[str, str, int], list[dict[str, float]]] = {row: [] for row in rows}
    for number in range(args.rounds):
        for row in rows if number % 2 == 0 else list(reversed(rows)):
            run = f"{row[0]}-{row[1]}-{row[2]}-{number}-{time.time_ns()}"
            result = await run_row(drivers[row[0]], row[1], row[2], args.seconds, meter, run)
            results[row].append(result)
    table = []
    for (driver, kind, tasks), found in results.items():
        line: dict[str, Any] = {"driver": driver, "kind": kind, "tasks": tasks}
        for field in ("ops", "client_us", "server_us"):
            line[field] = statistics.median(r[field] for r in found)
        line["rounds"] = found
        table.append(line)
    return table


def print_table(table: list[dict[str, Any]]) -> None:
    print(
        f"{'row':<8} {'tasks':>5} {'driver':<8} {'ops/s':>8} {'client us/trip':>15} "
        f"{'server us/trip':>15} {'client vs psycopg':>18}"
    )
    client = {(r["kind"], r["tasks"], r["driver"]): r["client_us"] for r in table}
    for row in table:
        base = client.get((row["kind"], row["tasks"], "psycopg"))
        print(
            f"{row['kind']:<8} {row['tasks']:>5} {row['driver']:<8} {row['ops']:>8.0f} "
            f"{row['client_us']:>15.1f} {row['server_us']:>15.1f} "
            f"{row['client_us'] / base if base else float('nan'):>18.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", default=harness.default_postgres())
    parser.add_argument("--postgres-kind", choices=("fast", "machine"), default="fast")
    parser.add_argument("--seconds", type=float, default=3.0, help="per row per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=16, help="concurrent tasks (connections)")
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    harness.use_repo()
    harness.use_deps()
    if args.quick:
        args.seconds, args.rounds = 1.0, 1
    import uvloop

    from idempotence.stores.postgres import PostgresStore

    with contextlib.ExitStack() as stack:
        admin = args.postgres
        if args.postgres_kind == "fast":
            admin = stack.enter_context(harness.fast_cluster())
        dsn, dbname = stack.enter_context(harness.postgres_database(admin, "drivers"))
        url = harness.url_of(dsn)
        with PostgresStore(url) as store:
            store.migrate()
        harness.in_service(dsn)
        meter = harness.PostgresMeter(admin, dbname)
        stack.callback(meter.close)
        table = uvloop.run(measure(url, meter, args))
    if args.json:
        print(json.dumps({"options": vars(args), "rows": table}, indent=2))
        return
    kind = "a throwaway cluster (fsync=off)" if args.postgres_kind == "fast" else args.postgres
    print(f"drivers on uvloop against {kind}; {args.seconds:g} s per row x {args.rounds} rounds")
    print_table(table)


if __name__ == "__main__":
    main()
