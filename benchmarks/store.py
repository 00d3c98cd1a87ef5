"""Key-store throughput, measured against the same statements issued by hand.

Run it from the repository root::

    .venv/bin/python benchmarks/store.py                 # the full run, about 2 minutes
    .venv/bin/python benchmarks/store.py --quick         # a smoke run, about 20 seconds
    .venv/bin/python benchmarks/store.py --seconds 2 --rounds 5 --json
    .venv/bin/python benchmarks/store.py --backend sqlite --api async   # one corner

PostgreSQL comes from ``--postgres URL`` (default: ``$IDEMPOTENCE_TEST_POSTGRES``, else
``postgresql://postgres@127.0.0.1:5432/postgres``); the script creates a database
``idempotence_bench_<pid>`` there and drops it at the end. SQLite runs on a file in a
temporary directory. Both get their schema from ``store.migrate()``.

What is measured, for PostgreSQL and SQLite, the sync and the async store, with 1 and
16 concurrent workers (threads for sync, asyncio tasks for async):

``pair``
    ``store.claim()`` of a new key, then ``store.finish()`` with a small response: what
    every first request pays. One pair is one operation.
``replay``
    ``store.claim()`` of a finished key, which answers REPLAY with the stored response:
    what every retry pays.

The baseline ("by hand") issues the very statements the store runs (the same text,
loaded from the package's ``queries.sql``, with the same parameters) straight through
the driver, with none of the library's Python around them:

* PostgreSQL: a ``psycopg_pool`` pool of autocommit connections (the same pool object
  the store is given), one ``pool.connection()`` per statement as the store takes, rows
  fetched as plain tuples. A pair is the ``claim`` then the ``finish`` statement; a
  replay is one ``claim`` statement on a finished key.
* SQLite: ``sqlite3`` connections opened with the store's settings (WAL, default
  ``synchronous``, autocommit, busy timeout), one per worker. A pair is ``claim_read``
  in autocommit (the store's preview), ``BEGIN IMMEDIATE; claim_insert; COMMIT``, then
  the ``finish`` UPDATE; a replay is ``claim_read`` alone in autocommit. The async
  baseline gives each connection a thread of its own and hops to it for every
  statement, as the async SQLite store does.
  Writers wait for each other in SQLite's busy handler: queueing them better is the
  library's business, and shows as a ratio above 1.

Both sides serialise the request parameters and the response headers to JSON on every
operation, because any implementation has to.

Each cell is warmed up, then measured in ``--rounds`` rounds of ``--seconds`` per side,
store and baseline back to back, in alternating order. The ops/s columns are the
medians over the rounds; ``ratio`` is the median of the per-round ratios store /
baseline (a pair of back-to-back runs shares whatever else the machine was doing). A
ratio of 1.0 means the library costs nothing over the bare statements; the target is
``>= 0.9`` everywhere. The script exits 0 whatever the ratios are: it measures, it does
not judge (only an error makes it fail).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import _harness as harness
import psycopg
import psycopg_pool
from psycopg import conninfo
from psycopg import sql as pgsql

from idempotence import _queries
from idempotence.states import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_RETENTION,
    ClaimRequest,
    Outcome,
    StoredResponse,
)
from idempotence.stores import AsyncStore, Store
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from idempotence.stores.sqlite import DEFAULT_BUSY_TIMEOUT, AsyncSqliteStore, SqliteStore

Backend = Literal["postgres", "sqlite"]
Api = Literal["sync", "async"]
Op = Literal["pair", "replay"]
Side = Literal["store", "baseline"]
T = TypeVar("T")

BACKENDS: tuple[Backend, ...] = ("postgres", "sqlite")
APIS: tuple[Api, ...] = ("sync", "async")
OPS: tuple[Op, ...] = ("pair", "replay")
WORKER_COUNTS = (1, 16)
TARGET = 0.9
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"

# One request, as a small JSON API would see it. The claim's other fields keep
# ClaimRequest's defaults, which the baseline spells out.
FINGERPRINT = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
PARAMS = {"amount": 1200, "currency": "eur", "ride": "r_42"}
RESPONSE = StoredResponse.of(201, {"content-type": "application/json"}, b'{"id": 1}')

# Every worker has its own tenant, and its own finished keys to replay, so replays of
# different workers never queue on the same row.
SCOPES = [f"tenant-{worker}" for worker in range(max(WORKER_COUNTS))]
REPLAY_KEYS = [f"replay-{n}" for n in range(8)]

_run_ids = itertools.count()


def _request(worker: int, key: str) -> ClaimRequest:
    return ClaimRequest(SCOPES[worker], key, FINGERPRINT, params=PARAMS)


def _claim_params(worker: int, key: str, lock_timeout: Any, retention: Any) -> dict[str, Any]:
    return {
        "scope": SCOPES[worker],
        "key": key,
        "method": "POST",
        "path": "/",
        "fingerprint": FINGERPRINT,
        "params": json.dumps(PARAMS, separators=(",", ":")),
        "flow": "default",
        "lock_timeout": lock_timeout,
        "retention": retention,
    }


def _finish_params(worker: int, key: str, key_id: int, token: int) -> dict[str, Any]:
    return {
        "status": RESPONSE.status,
        "headers": json.dumps([list(pair) for pair in RESPONSE.headers]),
        "body": RESPONSE.body,
        "error": None,
        "scope": SCOPES[worker],
        "key": key,
        "id": key_id,
        "token": token,
    }


def _columns(description: Any) -> tuple[int, int]:
    """Where ``id`` and ``lock_token`` are in a claim's row."""
    names = [column[0] for column in description]
    return names.index("id"), names.index("lock_token")


class BenchError(RuntimeError):
    """A benchmark operation did not get the outcome it was built for."""


# -- the two sides, sync -----------------------------------------------------------------


class SyncSubject(Protocol):
    def pair(self, worker: int, key: str) -> None: ...

    def replay(self, worker: int, key: str) -> None: ...


class StoreSubject:
    """The library: a claim and a finish through a sync store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def pair(self, worker: int, key: str) -> None:
        claim = self.store.claim(_request(worker, key))
        if claim.lease is None:
            raise BenchError(f"claim of new key {key!r} answered {claim.outcome}")
        self.store.finish(claim.lease, RESPONSE)

    def replay(self, worker: int, key: str) -> None:
        claim = self.store.claim(_request(worker, key))
        if claim.outcome is not Outcome.REPLAY:
            raise BenchError(f"claim of finished key {key!r} answered {claim.outcome}")


class PostgresByHand:
    """The store's PostgreSQL statements, issued with psycopg alone."""

    def __init__(self, pool: psycopg_pool.ConnectionPool[Any]) -> None:
        queries = _queries.load("postgres")
        self.pool = pool
        self.claim_sql, self.finish_sql = queries["claim"], queries["finish"]
        self.columns: tuple[int, int] | None = None

    def _claim(self, worker: int, key: str) -> list[tuple[Any, ...]]:
        params = _claim_params(worker, key, DEFAULT_LOCK_TIMEOUT, DEFAULT_RETENTION)
        with self.pool.connection() as conn:
            cur = conn.execute(self.claim_sql, params)
            rows: list[tuple[Any, ...]] = cur.fetchall()
        if self.columns is None:
            self.columns = _columns(cur.description)
        return rows

    def pair(self, worker: int, key: str) -> None:
        rows = self._claim(worker, key)
        if not rows or not rows[0][0]:
            raise BenchError(f"claim of new key {key!r} did not take it")
        assert self.columns is not None
        key_id, token = rows[0][self.columns[0]], rows[0][self.columns[1]]
        with self.pool.connection() as conn:
            finish = _finish_params(worker, key, key_id, token)
            done = conn.execute(self.finish_sql, finish).fetchall()
        if not done:
            raise BenchError(f"finish of key {key!r} lost its lock")

    def replay(self, worker: int, key: str) -> None:
        if not self._claim(worker, key):
            raise BenchError(f"claim of finished key {key!r} returned no row")


def _sqlite_connect(path: str) -> sqlite3.Connection:
    # The store's settings (stores/sqlite.py, connect()), spelled out.
    conn = sqlite3.connect(
        path, timeout=DEFAULT_BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
    )
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _sqlite_fetch(conn: sqlite3.Connection, sql: str, params: Any = ()) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def _sqlite_insert(conn: sqlite3.Connection, sql: str, params: Any) -> tuple[list[Any], Any]:
    cur = conn.execute(sql, params)
    return cur.fetchall(), cur.description


class SqliteByHand:
    """The store's SQLite statements, issued with sqlite3 alone: one connection a worker."""

    def __init__(self, path: str, workers: int) -> None:
        queries = _queries.load("sqlite")
        self.read_sql, self.insert_sql = queries["claim_read"], queries["claim_insert"]
        self.finish_sql = queries["finish"]
        self.conns = [_sqlite_connect(path) for _ in range(workers)]
        self.lock_timeout = DEFAULT_LOCK_TIMEOUT.total_seconds()
        self.retention = DEFAULT_RETENTION.total_seconds()
        self.columns: tuple[int, int] | None = None

    def pair(self, worker: int, key: str) -> None:
        conn = self.conns[worker]
        params = _claim_params(worker, key, self.lock_timeout, self.retention)
        if conn.execute(self.read_sql, params).fetchall():
            raise BenchError(f"new key {key!r} exists")
        conn.execute("BEGIN IMMEDIATE")
        try:
            rows, description = _sqlite_insert(conn, self.insert_sql, params)
            if not rows:
                raise BenchError(f"new key {key!r} exists")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if self.columns is None:
            self.columns = _columns(description)
        row = rows[0]
        key_id, token = row[self.columns[0]], row[self.columns[1]]
        if not conn.execute(self.finish_sql, _finish_params(worker, key, key_id, token)).fetchall():
            raise BenchError(f"finish of key {key!r} lost its lock")

    def replay(self, worker: int, key: str) -> None:
        params = {"scope": SCOPES[worker], "key": key}
        if not self.conns[worker].execute(self.read_sql, params).fetchall():
            raise BenchError(f"finished key {key!r} is missing")

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


# -- the two sides, async ----------------------------------------------------------------


class AsyncSubject(Protocol):
    async def pair(self, worker: int, key: str) -> None: ...

    async def replay(self, worker: int, key: str) -> None: ...


class AsyncStoreSubject:
    def __init__(self, store: AsyncStore) -> None:
        self.store = store

    async def pair(self, worker: int, key: str) -> None:
        claim = await self.store.claim(_request(worker, key))
        if claim.lease is None:
            raise BenchError(f"claim of new key {key!r} answered {claim.outcome}")
        await self.store.finish(claim.lease, RESPONSE)

    async def replay(self, worker: int, key: str) -> None:
        claim = await self.store.claim(_request(worker, key))
        if claim.outcome is not Outcome.REPLAY:
            raise BenchError(f"claim of finished key {key!r} answered {claim.outcome}")


class AsyncPostgresByHand:
    def __init__(self, pool: psycopg_pool.AsyncConnectionPool[Any]) -> None:
        queries = _queries.load("postgres")
        self.pool = pool
        self.claim_sql, self.finish_sql = queries["claim"], queries["finish"]
        self.columns: tuple[int, int] | None = None

    async def _claim(self, worker: int, key: str) -> list[tuple[Any, ...]]:
        params = _claim_params(worker, key, DEFAULT_LOCK_TIMEOUT, DEFAULT_RETENTION)
        async with self.pool.connection() as conn:
            cur = await conn.execute(self.claim_sql, params)
            rows: list[tuple[Any, ...]] = await cur.fetchall()
        if self.columns is None:
            self.columns = _columns(cur.description)
        return rows

    async def pair(self, worker: int, key: str) -> None:
        rows = await self._claim(worker, key)
        if not rows or not rows[0][0]:
            raise BenchError(f"claim of new key {key!r} did not take it")
        assert self.columns is not None
        key_id, token = rows[0][self.columns[0]], rows[0][self.columns[1]]
        async with self.pool.connection() as conn:
            cur = await conn.execute(self.finish_sql, _finish_params(worker, key, key_id, token))
            done = await cur.fetchall()
        if not done:
            raise BenchError(f"finish of key {key!r} lost its lock")

    async def replay(self, worker: int, key: str) -> None:
        if not await self._claim(worker, key):
            raise BenchError(f"claim of finished key {key!r} returned no row")


class AsyncSqliteByHand:
    """Like :class:`SqliteByHand`, with each connection confined to a thread of its own
    and every statement one hop to that thread, as the async SQLite store runs them."""

    def __init__(self, path: str, workers: int) -> None:
        self.sync = SqliteByHand(path, workers)
        self.threads = [ThreadPoolExecutor(1, "bench-sqlite") for _ in range(workers)]

    async def _run(self, worker: int, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.threads[worker], fn, *args)

    async def pair(self, worker: int, key: str) -> None:
        s, conn = self.sync, self.sync.conns[worker]
        params = _claim_params(worker, key, s.lock_timeout, s.retention)
        await self._run(worker, _sqlite_fetch, conn, "BEGIN IMMEDIATE")
        try:
            if await self._run(worker, _sqlite_fetch, conn, s.read_sql, params):
                raise BenchError(f"new key {key!r} exists")
            rows, description = await self._run(worker, _sqlite_insert, conn, s.insert_sql, params)
            await self._run(worker, _sqlite_fetch, conn, "COMMIT")
        except BaseException:
            await self._run(worker, _sqlite_fetch, conn, "ROLLBACK")
            raise
        if s.columns is None:
            s.columns = _columns(description)
        row = rows[0]
        key_id, token = row[s.columns[0]], row[s.columns[1]]
        finish = _finish_params(worker, key, key_id, token)
        if not await self._run(worker, _sqlite_fetch, conn, s.finish_sql, finish):
            raise BenchError(f"finish of key {key!r} lost its lock")

    async def replay(self, worker: int, key: str) -> None:
        params = {"scope": SCOPES[worker], "key": key}
        conn = self.sync.conns[worker]
        if not await self._run(worker, _sqlite_fetch, conn, self.sync.read_sql, params):
            raise BenchError(f"finished key {key!r} is missing")

    def close(self) -> None:
        # Wait for every statement in flight: closing a sqlite3 connection under a
        # thread that still uses it crashes the interpreter.
        for thread in self.threads:
            thread.shutdown(wait=True)
        self.sync.close()


# -- drivers: N workers hammer one operation for a while ---------------------------------

KeyOf = Callable[[int, int], str]
"""The key a worker uses for its n-th operation."""


def _key_of(op: Op) -> KeyOf:
    if op == "replay":
        return lambda worker, n: REPLAY_KEYS[n % len(REPLAY_KEYS)]
    run = next(_run_ids)
    return lambda worker, n: f"pair-{run}-{worker}-{n}"


def drive_threads(
    call: Callable[[int, str], None], key_of: KeyOf, workers: int, seconds: float
) -> float:
    """Run ``call`` on ``workers`` threads for ``seconds``; return operations per second."""
    counts = [0] * workers
    errors: list[BaseException] = []
    start = threading.Barrier(workers + 1)

    def work(worker: int) -> None:
        start.wait()
        deadline = time.perf_counter() + seconds
        n = 0
        try:
            while time.perf_counter() < deadline:
                call(worker, key_of(worker, n))
                n += 1
        except BaseException as exc:
            errors.append(exc)
        counts[worker] = n

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(workers)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return sum(counts) / elapsed


async def drive_tasks(
    call: Callable[[int, str], Awaitable[None]], key_of: KeyOf, workers: int, seconds: float
) -> float:
    """Run ``call`` in ``workers`` asyncio tasks for ``seconds``; return operations per second."""
    began = time.perf_counter()
    deadline = began + seconds

    async def work(worker: int) -> int:
        n = 0
        while time.perf_counter() < deadline:
            await call(worker, key_of(worker, n))
            n += 1
        return n

    counts = await asyncio.gather(*(work(w) for w in range(workers)))
    return sum(counts) / (time.perf_counter() - began)


# -- cells, rounds, results --------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    seconds: float
    rounds: int
    warmup: float
    postgres: str
    sqlite_path: str


@dataclass(frozen=True)
class Result:
    backend: Backend
    api: Api
    workers: int
    op: Op
    store_ops: float
    baseline_ops: float
    ratio: float
    store_rounds: tuple[float, ...]
    baseline_rounds: tuple[float, ...]


Measure = Callable[[Side, Op, float], float]
"""Run one side of one operation for some seconds; return operations per second."""


def measure_cell(
    measure: Measure, backend: Backend, api: Api, workers: int, op: Op, settings: Settings
) -> Result:
    for side in ("store", "baseline"):
        measure(side, op, settings.warmup)
    rounds: dict[Side, list[float]] = {"store": [], "baseline": []}
    for n in range(settings.rounds):
        # Alternate who goes first, so a drift (a growing table, a neighbour's burst)
        # does not always favour the same side.
        order: tuple[Side, Side] = ("store", "baseline") if n % 2 == 0 else ("baseline", "store")
        for side in order:
            rounds[side].append(measure(side, op, settings.seconds))
    ratios = [s / b for s, b in zip(rounds["store"], rounds["baseline"], strict=True)]
    result = Result(
        backend=backend,
        api=api,
        workers=workers,
        op=op,
        store_ops=statistics.median(rounds["store"]),
        baseline_ops=statistics.median(rounds["baseline"]),
        ratio=statistics.median(ratios),
        store_rounds=tuple(rounds["store"]),
        baseline_rounds=tuple(rounds["baseline"]),
    )
    print(f"  {_format_row(result)}", file=sys.stderr, flush=True)
    return result


def _postgres_pool(url: str, workers: int) -> psycopg_pool.ConnectionPool[Any]:
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        url, min_size=workers, max_size=workers, kwargs={"autocommit": True}, open=True
    )
    pool.wait()
    return pool


def run_sync(backend: Backend, workers: int, settings: Settings) -> list[Result]:
    with contextlib.ExitStack() as stack:
        store: Store
        baseline: SyncSubject
        if backend == "postgres":
            pool = stack.enter_context(_postgres_pool(settings.postgres, workers))
            store = PostgresStore(pool)
            baseline = PostgresByHand(pool)
        else:
            store = SqliteStore(settings.sqlite_path)
            by_hand = SqliteByHand(settings.sqlite_path, workers)
            stack.callback(by_hand.close)
            baseline = by_hand
        stack.callback(store.close)
        subjects: dict[Side, SyncSubject] = {"store": StoreSubject(store), "baseline": baseline}

        def measure(side: Side, op: Op, seconds: float) -> float:
            subject = subjects[side]
            call = subject.pair if op == "pair" else subject.replay
            return drive_threads(call, _key_of(op), workers, seconds)

        return [measure_cell(measure, backend, "sync", workers, op, settings) for op in OPS]


def run_async(backend: Backend, workers: int, settings: Settings) -> list[Result]:
    by_hand: AsyncSqliteByHand | None = None
    try:
        with asyncio.Runner() as runner:
            async_pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
            store: AsyncStore
            baseline: AsyncSubject
            if backend == "postgres":
                async_pool = psycopg_pool.AsyncConnectionPool(
                    settings.postgres,
                    min_size=workers,
                    max_size=workers,
                    kwargs={"autocommit": True},
                    open=False,
                )
                runner.run(async_pool.open(wait=True))
                store = AsyncPostgresStore(async_pool)
                baseline = AsyncPostgresByHand(async_pool)
            else:
                store = AsyncSqliteStore(settings.sqlite_path)
                baseline = by_hand = AsyncSqliteByHand(settings.sqlite_path, workers)
            subjects: dict[Side, AsyncSubject] = {
                "store": AsyncStoreSubject(store),
                "baseline": baseline,
            }

            def measure(side: Side, op: Op, seconds: float) -> float:
                subject = subjects[side]
                call = subject.pair if op == "pair" else subject.replay
                return runner.run(drive_tasks(call, _key_of(op), workers, seconds))

            try:
                return [
                    measure_cell(measure, backend, "async", workers, op, settings) for op in OPS
                ]
            finally:
                runner.run(store.close())
                if async_pool is not None:
                    runner.run(async_pool.close())
    finally:
        # After the runner: a failed run may leave statements in flight on its threads.
        if by_hand is not None:
            by_hand.close()


# -- databases ---------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_database(admin_url: str) -> Iterator[str]:
    """A fresh database on the server of ``admin_url``, dropped afterwards; yields its URL."""
    name = f"idempotence_bench_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        yield conninfo.make_conninfo(admin_url, dbname=name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            drop = pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            admin.execute(drop.format(pgsql.Identifier(name)))


def prepare(store: Store) -> None:
    """Apply the schema and finish every worker's replay keys."""
    store.migrate()
    for worker in range(len(SCOPES)):
        for key in REPLAY_KEYS:
            claim = store.claim(_request(worker, key))
            assert claim.lease is not None, claim.outcome
            store.finish(claim.lease, RESPONSE)


# -- output ------------------------------------------------------------------------------

HEADER = ("backend", "api", "workers", "op", "store ops/s", "baseline ops/s", "ratio")
WIDTHS = (8, 5, 7, 6, 11, 14, 5)


def _format_row(r: Result) -> str:
    cells = (
        r.backend.ljust(WIDTHS[0]),
        r.api.ljust(WIDTHS[1]),
        str(r.workers).rjust(WIDTHS[2]),
        r.op.ljust(WIDTHS[3]),
        f"{r.store_ops:,.0f}".rjust(WIDTHS[4]),
        f"{r.baseline_ops:,.0f}".rjust(WIDTHS[5]),
        f"{r.ratio:.3f}".rjust(WIDTHS[6]),
    )
    return "  ".join(cells)


def format_table(results: list[Result]) -> str:
    head = "  ".join(
        title.ljust(width) if n < 4 else title.rjust(width)
        for n, (title, width) in enumerate(zip(HEADER, WIDTHS, strict=True))
    )
    lines = [head, "-" * len(head), *(_format_row(r) for r in results)]
    below = [r for r in results if r.ratio < TARGET]
    if below:
        names = ", ".join(f"{r.backend}/{r.api}/{r.workers}/{r.op}" for r in below)
        lines.append(f"every ratio >= {TARGET}: NO ({len(below)} below: {names})")
    else:
        lines.append(f"every ratio >= {TARGET}: yes")
    return "\n".join(lines)


def run_backend(backend: Backend, apis: list[Api], settings: Settings) -> list[Result]:
    """Every cell of one backend, on a database prepared for it."""
    setup: Store = (
        PostgresStore(settings.postgres)
        if backend == "postgres"
        else SqliteStore(settings.sqlite_path)
    )
    with setup:
        prepare(setup)
    if backend == "postgres":
        harness.in_service(settings.postgres)  # statistics, as a table in service has
    results: list[Result] = []
    for api in apis:
        run = run_sync if api == "sync" else run_async
        for workers in WORKER_COUNTS:
            print(f"{backend} {api} x{workers}", file=sys.stderr, flush=True)
            results.extend(run(backend, workers, settings))
    return results


def describe_postgres(url: str) -> str:
    with psycopg.connect(url) as conn:
        version, sync = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit')"
        ).fetchone() or ("?", "?")
    return f"PostgreSQL {str(version).split()[0]} (synchronous_commit={sync})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--postgres",
        default=os.environ.get("IDEMPOTENCE_TEST_POSTGRES", DEFAULT_POSTGRES),
        help="server to create the benchmark database on (default: %(default)s)",
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="per side, per round")
    parser.add_argument("--rounds", type=int, default=3, help="back-to-back rounds per cell")
    parser.add_argument("--quick", action="store_true", help="a ~20 s smoke run (0.15 s per side)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="repeatable")
    parser.add_argument("--api", action="append", choices=APIS, help="repeatable")
    args = parser.parse_args(argv)
    seconds: float = 0.15 if args.quick else args.seconds
    backends: list[Backend] = args.backend or list(BACKENDS)
    apis: list[Api] = args.api or list(APIS)

    began = time.perf_counter()
    results: list[Result] = []
    versions = [f"Python {platform.python_version()}", f"psycopg {psycopg.__version__}"]
    with tempfile.TemporaryDirectory(prefix="idempotence-bench-") as tmp:
        for backend in backends:
            with contextlib.ExitStack() as stack:
                url = ""
                if backend == "postgres":
                    url = stack.enter_context(postgres_database(args.postgres))
                    versions.append(describe_postgres(url))
                else:
                    versions.append(f"SQLite {sqlite3.sqlite_version} (WAL)")
                settings = Settings(
                    seconds=seconds,
                    rounds=args.rounds,
                    warmup=max(0.05, seconds / 4),
                    postgres=url,
                    sqlite_path=str(Path(tmp) / "keys.sqlite3"),
                )
                results.extend(run_backend(backend, apis, settings))
    elapsed = time.perf_counter() - began

    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return 0
    print(f"idempotence key store: {', '.join(versions)}; {os.cpu_count()} CPUs")
    print(
        f"{args.rounds} rounds x {seconds:g} s per side; ops/s = median; ratio = median of "
        "store / baseline per round"
    )
    print()
    print(format_table(results))
    print(f"runtime {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
