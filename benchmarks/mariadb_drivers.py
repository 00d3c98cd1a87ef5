"""Which MariaDB driver the MariaDB store runs on: the five Python drivers side by side
on a claim-like transaction, with the client CPU each spends per call.

Run it from the repository root against a MariaDB (10.6 or later)::

    .venv/bin/pip install pymysql aiomysql asyncmy mysqlclient mariadb
    .venv/bin/python benchmarks/mariadb_drivers.py               # 3 rounds of 2 s per row
    .venv/bin/python benchmarks/mariadb_drivers.py --quick       # a smoke run
    .venv/bin/python benchmarks/mariadb_drivers.py --json

mysqlclient and the MariaDB connector (``mariadb``) build against the C client
library (Debian: ``apt-get install libmariadb-dev``); a driver that does not import is
reported as missing and skipped. ``--url`` (default ``$IDEMPOTENCE_TEST_MARIADB``,
else ``mariadb://root@127.0.0.1:3306``) names the server; the script creates
``idempotence_drivers_<pid>`` and drops it at the end.

One call is the shape of the store's claim of a key: ``BEGIN``; an ``INSERT ... ON
DUPLICATE KEY UPDATE`` of the key (a new key, or the lock taken again); ``SELECT ...
FOR UPDATE`` of its row; ``COMMIT``: four round trips. Rows, for each driver, at 1
connection and at ``--workers`` connections (threads for a sync driver, tasks for an
async one):

``calls/s``       claims per second
``client us``     this process's CPU time (user + system) per call: what the app
                  server pays the driver for one claim

The rounds alternate the drivers' order; medians are shown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import itertools
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

SYNC = ("pymysql", "mysqlclient", "mariadb")
ASYNC = ("aiomysql", "asyncmy")
MODULES = {
    "pymysql": "pymysql",
    "mysqlclient": "MySQLdb",
    "mariadb": "mariadb",
    "aiomysql": "aiomysql",
    "asyncmy": "asyncmy",
}

SCHEMA = """
CREATE TABLE idempotency_keys (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    scope VARCHAR(255) NOT NULL,
    `key` VARCHAR(255) NOT NULL,
    fingerprint VARCHAR(128) NOT NULL,
    lock_token BIGINT NOT NULL DEFAULT 1,
    locked_at DATETIME(6),
    created_at DATETIME(6) NOT NULL DEFAULT UTC_TIMESTAMP(6),
    UNIQUE KEY (scope, `key`)
)
"""

# The claim's two statements, in the two placeholder styles the drivers take.
CLAIM = (
    "INSERT INTO idempotency_keys (scope, `key`, fingerprint, locked_at) "
    "VALUES ({p}, {p}, {p}, UTC_TIMESTAMP(6)) "
    "ON DUPLICATE KEY UPDATE lock_token = lock_token + 1, locked_at = UTC_TIMESTAMP(6)"
)
READ = "SELECT * FROM idempotency_keys WHERE scope = {p} AND `key` = {p} FOR UPDATE"


def server(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "password": parts.password or "",
    }


def connect_sync(driver: str, where: dict[str, Any], database: str) -> Any:
    module = importlib.import_module(MODULES[driver])
    # PyMySQL, mysqlclient and the MariaDB connector all take these names.
    return module.connect(**where, database=database)


async def connect_async(driver: str, where: dict[str, Any], database: str) -> Any:
    module = importlib.import_module(MODULES[driver])
    return await module.connect(
        host=where["host"],
        port=where["port"],
        user=where["user"],
        password=where["password"],
        db=database,
        autocommit=False,
    )


def placeholder(driver: str) -> str:
    return "?" if driver == "mariadb" else "%s"


def sync_claim(driver: str, conn: Any, key: str) -> None:
    p = placeholder(driver)
    cur = conn.cursor()
    try:
        if driver == "mariadb":
            conn.begin()
        else:
            cur.execute("BEGIN")
        cur.execute(CLAIM.format(p=p), ("bench", key, key))
        cur.execute(READ.format(p=p), ("bench", key))
        cur.fetchall()
        conn.commit()
    finally:
        cur.close()


async def async_claim(conn: Any, key: str) -> None:
    async with conn.cursor() as cur:
        await conn.begin()
        await cur.execute(CLAIM.format(p="%s"), ("bench", key, key))
        await cur.execute(READ.format(p="%s"), ("bench", key))
        await cur.fetchall()
        await conn.commit()


def keys(prefix: str) -> Callable[[], str]:
    """New keys, with one in four a key taken before (the takeover's update)."""
    counter = itertools.count()

    def next_key() -> str:
        n = next(counter)
        return f"{prefix}-{n // 4 if n % 4 == 3 else n}"

    return next_key


def run_sync(driver: str, where: dict[str, Any], database: str, workers: int, seconds: float):
    conns = [connect_sync(driver, where, database) for _ in range(workers)]
    stop = time.perf_counter() + seconds
    counts = [0] * workers
    start_cpu, start = time.process_time(), time.perf_counter()

    def work(index: int) -> None:
        next_key = keys(f"{driver}-{os.getpid()}-{index}-{time.time_ns()}")
        while time.perf_counter() < stop:
            sync_claim(driver, conns[index], next_key())
            counts[index] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    for conn in conns:
        conn.close()
    calls = sum(counts)
    return calls / elapsed, cpu / calls * 1e6


def run_async(driver: str, where: dict[str, Any], database: str, workers: int, seconds: float):
    async def main() -> tuple[float, float]:
        conns = [await connect_async(driver, where, database) for _ in range(workers)]
        stop = time.perf_counter() + seconds
        counts = [0] * workers

        async def work(index: int) -> None:
            next_key = keys(f"{driver}-{os.getpid()}-{index}-{time.time_ns()}")
            while time.perf_counter() < stop:
                await async_claim(conns[index], next_key())
                counts[index] += 1

        start_cpu, start = time.process_time(), time.perf_counter()
        await asyncio.gather(*(work(i) for i in range(workers)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        for conn in conns:
            conn.close()
        calls = sum(counts)
        return calls / elapsed, cpu / calls * 1e6

    return asyncio.run(main())


def available(driver: str) -> bool:
    try:
        importlib.import_module(MODULES[driver])
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        default=os.environ.get("IDEMPOTENCE_TEST_MARIADB", "mariadb://root@127.0.0.1:3306"),
    )
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="1 round of 0.5 s")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 0.5, 1
    where = server(args.url)
    database = f"idempotence_drivers_{os.getpid()}"
    import pymysql  # the set-up's own driver: the store's choice

    admin = pymysql.connect(autocommit=True, **where)
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {database}")
        cur.execute(f"USE {database}")
        cur.execute(SCHEMA)
    drivers = [d for d in (*SYNC, *ASYNC) if available(d)]
    missing = [d for d in (*SYNC, *ASYNC) if d not in drivers]
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    try:
        for round_ in range(args.rounds):
            order = drivers if round_ % 2 == 0 else list(reversed(drivers))
            for driver in order:
                for workers in (1, args.workers):
                    runner = run_async if driver in ASYNC else run_sync
                    results.setdefault((driver, workers), []).append(
                        runner(driver, where, database, workers, args.seconds)
                    )
    finally:
        with contextlib.suppress(pymysql.Error), admin.cursor() as cur:
            cur.execute(f"DROP DATABASE {database}")
        admin.close()
    rows = [
        {
            "driver": driver,
            "api": "async" if driver in ASYNC else "sync",
            "workers": workers,
            "calls_per_s": round(statistics.median(r[0] for r in runs)),
            "client_us_per_call": round(statistics.median(r[1] for r in runs)),
        }
        for (driver, workers), runs in results.items()
    ]
    if args.json:
        print(json.dumps({"rows": rows, "missing": missing}, indent=2))
        return
    print(f"{'driver':<12} {'api':<6} {'workers':>7} {'calls/s':>9} {'client us':>10}")
    for row in sorted(rows, key=lambda r: (r["workers"], r["api"], r["driver"])):
        print(
            f"{row['driver']:<12} {row['api']:<6} {row['workers']:>7} "
            f"{row['calls_per_s']:>9} {row['client_us_per_call']:>10}"
        )
    for driver in missing:
        print(f"{driver}: not installed, skipped")


if __name__ == "__main__":
    main()
