"""The machinery that http_bench.py, peers.py and drivers.py share (not a benchmark).

* the benchmarks' own dependencies (``benchmarks/requirements.txt``), installed by
  ``benchmarks/setup.sh`` into ``benchmarks/.deps`` and put at the END of ``sys.path``;
* ``wrk`` (C), installed by ``benchmarks/setup.sh`` too, driven by a Lua script that gives
  each request a unique Idempotency-Key (or one fixed key, for replay rows) and prints
  its summary as JSON;
* app servers: uvicorn with uvloop and httptools on a socket this process bound, one
  process per server, or deployed with several workers (``--deploy uvicorn-2``: uvicorn's
  own supervisor; ``--deploy gunicorn-2``: gunicorn's arbiter with uvicorn's workers),
  each worker building its own app, store and pool;
* CPU per request by process, from /proc: the app server (every process of its tree:
  supervisor or arbiter and workers), and the database server (the backends of the
  benchmark's own database, and the whole cluster);
* databases: a fresh database on the machine's PostgreSQL, a throwaway cluster with
  fsync=off and synchronous_commit=off, a throwaway redis-server;
* a hand-written Redis guard (the store's own two scripts by EVALSHA, no redis-py):
  the Redis floor of http_bench.py and profile_request.py;
* hand-written PostgreSQL guards (the store's own statements on a bare psycopg pool):
  http_bench.py's floors, and profile_request.py's request-as-transaction floors;
* a hand-written cached store (the PostgreSQL statements and Redis commands of
  ``AsyncCachedStore``, the two above together): http_bench.py's ``pg-fast+cache`` floors;
* rows measured in interleaved rounds (medians, same-run ratios), printed or as JSON.
"""

import argparse
import asyncio
import base64
import binascii
import collections
import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEPS = HERE / ".deps"
REQUIREMENTS = HERE / "requirements.txt"
CLOCK = os.sysconf("SC_CLK_TCK")
BODY = b'{"amount": 100}'

# -- the benchmarks' own dependencies ------------------------------------------------------


#: What to run when a dependency or wrk is missing: the benchmarks never install.
SETUP = "bash benchmarks/setup.sh"


def ensure_deps() -> Path:
    """benchmarks/.deps, installed from the current benchmarks/requirements.txt by
    benchmarks/setup.sh; exit with one line naming it when not."""
    stamp = DEPS / ".requirements.sha256"
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text().strip() != wanted:
        sys.exit(
            f"the benchmarks' dependencies ({REQUIREMENTS.name}) are not installed in "
            f"{DEPS}, or are out of date: run `{SETUP}`"
        )
    return DEPS


def use_deps() -> None:
    """Make benchmarks/.deps importable, after everything the virtualenv has."""
    ensure_deps()
    if str(DEPS) not in sys.path:
        sys.path.append(str(DEPS))


def use_repo() -> None:
    """Import this checkout's package (src/) and test support (tests/) first."""
    for path in (str(ROOT / "src"), str(ROOT)):
        if path not in sys.path:
            sys.path.insert(0, path)


def ensure_wrk() -> str:
    """The path of ``wrk``; exit with one line naming benchmarks/setup.sh when missing."""
    found = shutil.which("wrk")
    if found:
        return found
    sys.exit(f"wrk (the load generator, in C) is missing: run `{SETUP}` (apt-get install wrk)")


# -- wrk -----------------------------------------------------------------------------------

LUA = r"""
-- Each request gets the key PREFIX-THREAD-N (or the fixed key FIXED), and done()
-- prints the summary as one JSON line that the harness reads.
local thread_count, counter, prefix, fixed = 0, 0, "", nil
local threads = {}

function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_id", thread_count)
  table.insert(threads, thread)
end

function init(args)
  prefix = args[1] .. "-" .. tostring(thread_id)
  if args[2] ~= "-" then fixed = args[2] end
  wrk.method = "POST"
  wrk.body = '{"amount": 100}'
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = fixed or (prefix .. "-" .. counter)
  return wrk.format()
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"errors": %d, "non_2xx": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
  for _, thread in ipairs(threads) do
    local refused = thread:get("refused")
    if refused then io.write("WRK_REFUSED " .. refused .. "\n") end
  end
end
"""

LUA_REFUSED = r"""
-- The first answer that is not a 2xx, status and body on one line (wrk reads every
-- response into Lua for this, which costs it CPU: only where no number is read).
refused = nil

function response(status, headers, body)
  if status >= 300 and refused == nil then
    refused = status .. " " .. string.gsub(string.sub(body, 1, 400), "%s+", " ")
  end
end
"""


def lua_script(refused: bool = False) -> Path:
    """The script as a file (named by its content, so one file serves every run); with
    ``refused``, it also reports the first answer that is not a 2xx."""
    text = LUA + LUA_REFUSED if refused else LUA
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"idempotence-bench-{digest}.lua"
    if not path.exists():
        path.write_text(text)
    return path


def run_wrk(
    port: int,
    path: str,
    *,
    seconds: int,
    connections: int,
    threads: int,
    key: str,
    refused: bool = False,
) -> dict[str, Any]:
    """One wrk run; ``key`` is a unique prefix, or ``fixed:KEY`` for one key throughout.
    With ``refused`` (a smoke run, whose numbers are not read), ``result["refused"]``
    holds the first answer that was not a 2xx, status and body, else None."""
    prefix, fixed = (key, "-") if not key.startswith("fixed:") else ("x", key[6:])
    command = [ensure_wrk(), f"-t{min(threads, connections)}", f"-c{connections}"]
    command += [f"-d{seconds}s", "--timeout", "10s", "-s", str(lua_script(refused))]
    command += [f"http://127.0.0.1:{port}{path}", "--", prefix, fixed]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    result: dict[str, Any] | None = None
    first_refused = None
    for line in done.stdout.splitlines():
        if line.startswith("WRK_JSON "):
            result = dict(json.loads(line[9:]))
            result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
        elif line.startswith("WRK_REFUSED ") and first_refused is None:
            first_refused = line[12:]
    if result is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    result["refused"] = first_refused
    return result


def post(port: int, path: str, key: str) -> tuple[int, dict[str, str]]:
    """One POST with ``key``: the status and the headers (lower-case names)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=BODY,
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return int(response.status), {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"POST {path} answered {error.code}: {error.read()[:300]!r}") from None


# -- CPU by process --------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid: int, *, reaped_children: bool = False) -> float | None:
    """User + system CPU of a process so far, all its threads: from the scheduler's
    nanosecond counts (/proc/PID/task/*/schedstat) where the kernel has them, else
    from /proc/PID/stat in clock ticks (10 ms: too coarse for a backend that serves a
    few hundred short requests). With ``reaped_children``, also the CPU of its
    children that exited (ticks only: a postmaster's backends that quit)."""
    fields = _stat(pid)
    if fields is None:
        return None
    seconds = (int(fields[11]) + int(fields[12])) / CLOCK
    with contextlib.suppress(OSError, ValueError, IndexError):
        threads = os.listdir(f"/proc/{pid}/task")
        total = 0
        for thread in threads:
            with open(f"/proc/{pid}/task/{thread}/schedstat") as stat:
                total += int(stat.read().split()[0])
        # Threads that exited count in the ticks only: never report less than those.
        seconds = max(seconds, total / 1e9)
    if reaped_children:
        seconds += (int(fields[13]) + int(fields[14])) / CLOCK
    return seconds


def children(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) and int(fields[1]) == parent:
            pids.append(int(entry))
    return pids


def tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds so far of ``root`` and every process below it, by pid: a deployment's
    supervisor (or arbiter) and its workers, or a single server alone."""
    below: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))):
            below[int(fields[1])].append(int(entry))
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if (seconds := cpu_seconds(pid)) is not None:
            found[pid] = seconds
            todo += below.get(pid, [])
    return found


class Meter:
    """CPU seconds so far of the processes a row's database runs in, by name."""

    def snapshot(self) -> dict[str, dict[int, float]]:
        return {}

    @staticmethod
    def used(before: dict[int, float], after: dict[int, float]) -> float:
        # A process new since ``before`` counts from zero; one gone is lost (rare:
        # the pools keep their connections through a round).
        return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


class ProcessMeter(Meter):
    """One server process (a throwaway redis-server)."""

    def __init__(self, name: str, pid: int) -> None:
        self.name, self.pid = name, pid

    def snapshot(self) -> dict[str, dict[int, float]]:
        seconds = cpu_seconds(self.pid)
        return {self.name: {} if seconds is None else {self.pid: seconds}}


class Meters(Meter):
    """Several meters as one (a cached store: the PostgreSQL backends and Redis)."""

    def __init__(self, *meters: Meter) -> None:
        self.meters = meters

    def snapshot(self) -> dict[str, dict[int, float]]:
        found: dict[str, dict[int, float]] = {}
        for meter in self.meters:
            found.update(meter.snapshot())
        return found


class PostgresMeter(Meter):
    """``db``: the backends connected to ``dbname``; ``cluster``: every process of the
    cluster, its background writers included (on the shared server, other tenants'
    work too). Nothing when the server's processes are not readable here."""

    def __init__(self, admin_url: str, dbname: str) -> None:
        import psycopg

        self.dbname = dbname
        self.admin = psycopg.connect(admin_url, autocommit=True)
        self.postmaster: int | None = None
        # data_directory is for superusers, and a remote server's files are not here.
        with contextlib.suppress(OSError, ValueError, TypeError, psycopg.Error):
            directory = self.admin.execute("SHOW data_directory").fetchone()
            lines = Path(str(directory[0] if directory else "")).joinpath("postmaster.pid")
            self.postmaster = int(lines.read_text().split()[0])
        if self.postmaster is not None and _stat(self.postmaster) is None:
            self.postmaster = None

    def snapshot(self) -> dict[str, dict[int, float]]:
        if self.postmaster is None:
            return {}
        query = "SELECT pid FROM pg_stat_activity WHERE datname = %s"
        backends = [row[0] for row in self.admin.execute(query, (self.dbname,))]
        own = {pid: s for pid in backends if (s := cpu_seconds(pid)) is not None}
        cluster = {pid: s for pid in children(self.postmaster) if (s := cpu_seconds(pid))}
        cluster[self.postmaster] = cpu_seconds(self.postmaster, reaped_children=True) or 0.0
        return {"db": own, "cluster": cluster}

    def close(self) -> None:
        self.admin.close()


# -- databases -------------------------------------------------------------------------------


def default_postgres() -> str:
    env = os.environ.get("IDEMPOTENCE_TEST_POSTGRES", "")
    # The test suite's variable may also say "throwaway" or "embedded": not a URL.
    return env if env.startswith("postgres") else "postgresql://postgres@127.0.0.1:5432/postgres"


@contextlib.contextmanager
def postgres_database(admin_url: str, label: str) -> Iterator[tuple[str, str]]:
    """A new database (dropped at the end): its URL and its name."""
    import psycopg
    from psycopg import conninfo
    from psycopg import sql as pgsql

    name = f"idempotence_bench_{label}_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        yield conninfo.make_conninfo(admin_url, dbname=name), name
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            drop = pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            admin.execute(drop.format(pgsql.Identifier(name)))


def in_service(url: str, keys: int = 1000) -> None:
    """Give a freshly migrated key table what a table in service has: finished keys
    (in a scope of their own) and statistics. The store's connections plan their
    statements once only where the statistics make that safe, and plan at every run
    before (docs/design.md, section 11); a benchmark on a fresh database would
    measure only that start. Call it before the measured store opens its pool."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO idempotency_keys (scope, key, request_method, request_path,"
            " fingerprint, flow, lock_timeout, recovery_point, response_status,"
            " finished_at, expires_at)"
            " SELECT 'in-service', 'seed-' || n, 'POST', '/', 'f', 'http', '1 minute',"
            " 'finished', 201, now(), now() + interval '1 day'"
            " FROM generate_series(1, %s) AS n",
            (keys,),
        )
        conn.execute("ANALYZE idempotency_keys")


def url_of(dsn: str) -> str:
    """A libpq key=value string as a URL (asyncpg takes URLs only)."""
    from psycopg import conninfo

    params = conninfo.conninfo_to_dict(dsn)
    host, port = params.get("host", "127.0.0.1"), params.get("port", "5432")
    return f"postgresql://{params.get('user', 'postgres')}@{host}:{port}/{params['dbname']}"


@contextlib.contextmanager
def fast_cluster() -> Iterator[str]:
    """A throwaway PostgreSQL cluster with fsync=off, synchronous_commit=off (and
    full_page_writes=off), as the peers' own benchmarks run it: its superuser URL."""
    use_repo()
    from tests.support.postgres import throwaway_cluster

    with throwaway_cluster() as server:
        yield server.url


@contextlib.contextmanager
def throwaway_redis() -> Iterator[tuple[str, int]]:
    """A private redis-server (no persistence) on a free port: its URL (add ``/DB``)
    and its pid."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield f"redis://127.0.0.1:{port}", process.pid
    finally:
        stop(process)


class Throwaways:
    """The throwaway servers of one run, each started on first use and shared by every
    app server that asks (each in a database of its own), stopped with ``stack``."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self._cluster: str | None = None
        self._redis: tuple[str, int] | None = None

    def fast_cluster(self) -> str:
        """The superuser URL of a cluster with fsync=off (:func:`fast_cluster`)."""
        if self._cluster is None:
            self._cluster = self.stack.enter_context(fast_cluster())
        return self._cluster

    def redis(self) -> tuple[str, int]:
        """A redis-server's URL (add ``/DB``) and pid (:func:`throwaway_redis`)."""
        if self._redis is None:
            self._redis = self.stack.enter_context(throwaway_redis())
        return self._redis


def our_redis_missing() -> str | None:
    """Why this checkout has no Redis store (``open_async_store("redis://...")``), or
    None when it has one."""
    from idempotence import open_async_store

    try:
        open_async_store("redis://127.0.0.1:1/0")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# -- the Redis floor: the store's scripts by hand ------------------------------------


#: The claim script's read-back: 21 lengths (4 bytes, big-endian; -1 absent), then the
#: values present, in READ_FIELDS' order (redis.lua: read); status and body are the
#: 17th and 19th.
_LENGTHS = struct.Struct(">21i")


def settled_redis(claimed: int, packed: bytes) -> tuple[int, bytes, bool]:
    """What the hand-written guard answers for a Redis key it did not claim."""
    lengths = _LENGTHS.unpack_from(packed)
    at, values = _LENGTHS.size, []
    for length in lengths:
        values.append(packed[at : at + length] if length >= 0 else None)
        at += max(length, 0)
    if claimed or values[16] is None:
        return 409, b'{"error": "in progress"}', False
    return int(values[16]), values[18] or b"", True


class RespConnection(asyncio.Protocol):
    """One connection to Redis carrying every command in flight: while commands are
    in flight, those of a turn of the event loop go out in one write, and each reply,
    parsed by hiredis, answers the oldest command waiting (as the store's lane does)."""

    def __init__(self) -> None:
        import hiredis

        self.reader = hiredis.Reader()
        self.pack = hiredis.pack_command
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.out: list[bytes] = []
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            waiting = self.waiting.popleft()
            if not waiting.done():  # a call given up keeps its place
                waiting.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        while self.waiting:
            waiting = self.waiting.popleft()
            if not waiting.done():
                waiting.set_exception(ConnectionError("Redis closed the connection"))

    def flush(self) -> None:
        self.transport.write(b"".join(self.out))
        self.out.clear()

    def call(self, *args: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        if self.out or self.waiting:
            if not self.out:
                loop.call_soon(self.flush)
            self.out.append(self.pack(args))
        else:
            self.transport.write(self.pack(args))  # idle: nothing to batch with
        waiting = loop.create_future()
        self.waiting.append(waiting)
        return waiting


class RespClient:
    """One bare connection (`RespConnection`) to the Redis of ``url`` (``/DB`` selected),
    opened at first use with ``scripts`` loaded (``sha``: their SHA-1s by name): the
    hand-written rows' Redis, with no redis-py."""

    def __init__(self, url: str, scripts: dict[str, str]) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.db = int(parts.path.strip("/") or 0)
        self.scripts = scripts
        self.sha: dict[str, bytes] = {}
        self.opened: asyncio.Future[RespConnection] | None = None

    async def connection(self) -> RespConnection:
        if self.opened is None:
            self.opened = asyncio.ensure_future(self._open())
        return await self.opened

    async def _open(self) -> RespConnection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(RespConnection, *self.address)
        await conn.call(b"SELECT", self.db)
        for name, text in self.scripts.items():
            self.sha[name] = await conn.call(b"SCRIPT", b"LOAD", text)
        return conn

    async def close(self) -> None:
        if self.opened is not None:
            (await self.opened).transport.close()


class RedisHand(RespClient):
    """The hand-written rows on Redis: the store's own claim and finish scripts
    (``redis.lua``, loaded at the first connection) sent by EVALSHA on one asyncio
    protocol that parses replies with hiredis and carries every command in flight;
    no redis-py, no library code per request. What any guard that claims and finishes
    a key with these two scripts costs at least."""

    def __init__(self, url: str) -> None:
        from idempotence.stores.redis._store_shared import SCRIPTS

        super().__init__(url, {name: SCRIPTS[name] for name in ("claim", "finish")})

    async def guarded(
        self, key: str, path: str, answer: Callable[[], bytes]
    ) -> tuple[int, bytes, bool]:
        """Handler mode: claim, answer (``answer()``, the endpoint's work, once the claim
        took the key), finish; a key the claim did not take is answered from the record
        it read back (a replay)."""
        conn = await self.connection()
        record = b"bench:{%s}" % key.encode()
        record_id = b"%d" % (int.from_bytes(os.urandom(7)) + 1)
        claimed = await conn.call(
            b"EVALSHA", self.sha["claim"], 1, record, b"bench", key, key, b"POST", path,
            b"http", b"{}", 10_000_000, 86_400_000_000, record_id,
        )  # fmt: skip
        if len(claimed) == 3:
            return settled_redis(claimed[0], claimed[2])
        body = answer()
        done = await conn.call(
            b"EVALSHA", self.sha["finish"], 1, record, record_id, b"1", 201,
            b'[["content-type", "application/json"]]', body, b"0", b"", b"bench:settled",
        )  # fmt: skip
        if done != 1:
            raise RuntimeError("the floor's finish was refused")
        return 201, body, False


# -- hand-written PostgreSQL guards ---------------------------------------------------------


def claim_params(backend: str, key: str, path: str) -> dict[str, Any]:
    """The claim statement's parameters for ``key`` on ``path`` (the hand-written rows')."""
    timeout, retention = timedelta(seconds=10), timedelta(days=1)
    durations: tuple[Any, Any] = (timeout, retention)
    if backend == "sqlite":
        durations = (timeout.total_seconds(), retention.total_seconds())
    return {
        "scope": "bench",
        "key": key,
        "method": "POST",
        "path": path,
        "fingerprint": key,
        "params": "{}",
        "flow": "http",
        "lock_timeout": durations[0],
        "retention": durations[1],
    }


def finish_params(row: dict[str, Any], body: bytes) -> dict[str, Any]:
    return {
        "status": 201,
        "headers": '[["content-type", "application/json"]]',
        "body": body,
        "error": None,
        "scope": "bench",
        "key": row["key"],
        "id": row["id"],
        "token": row["lock_token"],
    }


def settled(row: dict[str, Any]) -> tuple[int, bytes, bool]:
    """What a hand-written guard answers for a key it did not claim."""
    if row.get("finished_at") is not None:
        return int(row["response_status"]), bytes(row["response_body"]), True
    return 409, b'{"error": "in progress"}', False


class PgHand:
    """The hand-written rows on PostgreSQL: a psycopg pool like the store's."""

    def __init__(self, url: str) -> None:
        import psycopg_pool

        from idempotence._queries import load
        from idempotence.stores.postgres import _breaker as _postgres_breaker
        from idempotence.stores.postgres import _store_async as _postgres_async
        from idempotence.stores.postgres import _store_shared as _postgres_base

        self.pool: Any = psycopg_pool.AsyncConnectionPool(
            url,
            max_size=20,
            kwargs={"autocommit": True},
            # The store's session settings, with its default statement bound.
            configure=_postgres_async._configure_async(
                _postgres_base.session_settings(_postgres_base.DEFAULT_STATEMENT_TIMEOUT),
                require_synchronous_standby=False,
                breaker=_postgres_breaker.Breaker(),
            ),
            open=False,
        )
        self.queries = load("postgres")
        self.deferred = _postgres_base.deferred_sql  # the finish as sent with a COMMIT
        self.opened = False

    async def open(self, wait: bool = False) -> None:
        """Open the pool (at the first request); with ``wait``, return once its first
        connections are set up, so that none is set up while a request runs."""
        if not self.opened:
            await self.pool.open(wait=wait)
            self.opened = True

    @contextlib.asynccontextmanager
    async def connection(self) -> Any:
        if not self.opened:
            await self.open()
        async with self.pool.connection() as conn:
            yield conn

    async def close(self) -> None:
        if self.opened:
            await self.pool.close()

    async def insert(self, sql: str, params: dict[str, Any]) -> None:
        async with self.connection() as conn, conn.transaction():
            await conn.execute(sql, params)

    async def _claim(self, cur: Any, claim: dict[str, Any]) -> dict[str, Any]:
        # The claim statement returns no row when a concurrent claim committed the key
        # after its snapshot; its caller runs it again, as the store does (queries.sql).
        for _ in range(3):
            await cur.execute(self.queries["claim"], claim)
            if (row := await cur.fetchone()) is not None:
                return dict(row)
        raise RuntimeError("the floor's claim found no row three times")

    async def guarded(
        self, claim: dict[str, Any], answer: Callable[[], bytes], write: tuple[str, Any] | None
    ) -> tuple[int, bytes, bool]:
        """Handler mode (``write`` None): claim, answer, finish, each autocommitted.
        Request-as-transaction: BEGIN+claim in one pipeline, the write, finish+COMMIT."""
        from psycopg.rows import dict_row

        from idempotence.stores._sql.ops import Query

        async with self.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            if write is None:
                row = await self._claim(cur, claim)
                if not row["claimed"]:
                    return settled(row)
                body = answer()
                await cur.execute(self.queries["finish"], finish_params(row, body))
                return 201, body, False
            async with conn.pipeline():
                await conn.execute("BEGIN")
                await cur.execute(self.queries["claim"], claim)
            row = await cur.fetchone() or await self._claim(cur, claim)
            try:
                if not row["claimed"]:
                    await conn.execute("ROLLBACK")
                    return settled(row)
                await conn.execute(*write)
                body = answer()
                finish = finish_params(row, body)
                async with conn.pipeline():
                    await conn.execute(
                        self.deferred(Query("finish", self.queries["finish"], finish)), finish
                    )
                    await conn.execute("COMMIT")
            except BaseException:
                await conn.execute("ROLLBACK")
                raise
            return 201, body, False

    async def one_write(
        self, claim: dict[str, Any], answer: Callable[[], bytes], write: tuple[str, Any]
    ) -> tuple[int, bytes, bool]:
        """Request-as-transaction writing the key row once (issue 13, item 5): BEGIN, a
        transaction-scoped advisory lock on the key and a read of its row in one
        pipeline, the write, then the finished row inserted with the COMMIT."""
        from psycopg.rows import dict_row

        from idempotence.stores._sql.ops import Query

        async with self.connection() as conn:
            lock = conn.cursor(row_factory=dict_row)
            cur = conn.cursor(row_factory=dict_row)
            async with conn.pipeline():
                await conn.execute("BEGIN")
                await lock.execute(ONE_WRITE_LOCK, claim)
                await cur.execute(ONE_WRITE_READ, claim)
            locked = (await lock.fetchone())["locked"]
            row = await cur.fetchone()
            try:
                if not locked or row is not None:
                    await conn.execute("ROLLBACK")
                    return settled(row) if row else (409, b'{"error": "in progress"}', False)
                await conn.execute(*write)
                body = answer()
                finish = {
                    **claim,
                    **finish_params({"key": claim["key"], "id": 0, "lock_token": 1}, body),
                }
                async with conn.pipeline():
                    await conn.execute(
                        self.deferred(Query("finish", ONE_WRITE_INSERT, finish)), finish
                    )
                    await conn.execute("COMMIT")
            except BaseException:
                await conn.execute("ROLLBACK")
                raise
            return 201, body, False


ONE_WRITE_LOCK = """
SELECT pg_try_advisory_xact_lock(hashtextextended(%(key)s, hashtextextended(%(scope)s, 0)))
    AS locked
"""
ONE_WRITE_READ = "SELECT * FROM idempotency_keys WHERE scope = %(scope)s AND key = %(key)s"
ONE_WRITE_INSERT = """
INSERT INTO idempotency_keys AS k (
    scope, key, request_method, request_path, fingerprint, request_params, flow,
    recovery_point, lock_timeout, last_run_at, response_status, response_headers,
    response_body, error, finished_at, expires_at
)
VALUES (
    %(scope)s, %(key)s, %(method)s, %(path)s, %(fingerprint)s, %(params)s::jsonb, %(flow)s,
    'finished', %(lock_timeout)s, statement_timestamp(), %(status)s, %(headers)s::jsonb,
    %(body)s, %(error)s, statement_timestamp(),
    statement_timestamp() + %(retention)s::interval
)
ON CONFLICT (scope, key) DO NOTHING
RETURNING id
"""


# -- the cached store's floor: PostgreSQL's statements and Redis's commands by hand -------


class CachedHand:
    """The hand-written rows of ``AsyncCachedStore`` in front of the PostgreSQL store
    (http_bench.py's ``pg-fast+cache``): per request, on the wire, what the store sends
    in handler mode and nothing else, on `PgHand`'s pool and one bare `RespClient`
    connection (no redis-py, no library code per request). As ``redis-cli MONITOR`` and
    PostgreSQL's ``log_statement=all`` show the store's requests:

    * a new key: Redis ``GET NAME`` (``NAME``: ``idempotence:cache:5:bench:KEY``, the
      store's ``Cache.name``), nil; PostgreSQL's ``claim`` (queries.sql, autocommitted),
      which takes the key; the endpoint's answer; PostgreSQL's ``finish``
      (autocommitted) returning ``id, finished_at, expires_at`` (the store's
      ``_finish_times``); Redis ``EVALSHA SET_SCRIPT 1 NAME ENTRY UNTIL``: the entry is
      ``E`` + the row id in 20 digits + the finished row as JSON (the claim's row with
      what the finish wrote: nothing is read back), ``UNTIL`` its expiry in Unix ms;
    * a replay (a finished key whose entry Redis holds): Redis ``GET NAME`` alone,
      answered from the entry (the request's scope, key and fingerprint, not expired);
      PostgreSQL sees nothing.

    Where Redis has no such entry the claim decides, as in the store: a finished key
    it answers (a replay from PostgreSQL) has its entry written, and an entry read
    first of an older row is refused by a tombstone. A key in progress answers 409;
    a finish that matches no row, or an entry the script refuses, raises (a 500): both
    show in ``errs``, so the floor cannot measure a shortcut. Its entries are the
    store's byte for byte (tests/test_benchmarks.py), so the library reads them.

    As `PgHand`'s handler mode, it holds one pooled connection from the claim to the
    finish (the store gives it back between them) and sends each claim and finish as
    itself, where the store batches those of concurrent requests (DESIGN 11)."""

    def __init__(self, url: str, redis_url: str, prefix: str = "idempotence:cache") -> None:
        from idempotence.stores._sql.ops import _returning_times
        from idempotence.stores.cached._store_shared import (
            DEFAULT_CLOCK_SKEW,
            DEFAULT_TTL,
            SET_SCRIPT,
            Cache,
        )
        from idempotence.stores.redis._store_shared import EPOCH, MICROSECOND

        self.pg = PgHand(url)
        self.redis = RespClient(redis_url, {"set": SET_SCRIPT})
        self.finish = _returning_times(self.pg.queries["finish"])
        # The store's defaults, which our_store keeps: the names of the keys of scope
        # "bench" up to the key, and an entry's life (microseconds).
        cache = Cache(
            prefix, ttl=DEFAULT_TTL, clock_skew=DEFAULT_CLOCK_SKEW, pause=0, instrumentation=None
        )
        self.names = cache.name("bench", "")
        self.ttl, self.skew = DEFAULT_TTL // MICROSECOND, DEFAULT_CLOCK_SKEW // MICROSECOND
        self.epoch, self.microsecond = EPOCH, MICROSECOND
        self.decoder = json.JSONDecoder()
        #: finish_params' headers, as the finished row holds them.
        self.headers = [["content-type", "application/json"]]

    async def close(self) -> None:
        await self.redis.close()
        await self.pg.close()

    async def guarded(
        self, key: str, path: str, answer: Callable[[], bytes]
    ) -> tuple[int, bytes, bool]:
        """Handler mode: the entry in Redis, else claim, answer (``answer()``, once the
        claim took the key), finish and the entry written; a key the claim did not take
        is answered from its row (a replay, or 409)."""
        from psycopg.rows import dict_row

        redis = await self.redis.connection()
        name = self.names + key.encode("utf-8", "surrogatepass")
        found = await redis.call(b"GET", name)
        entry = self.decoder.decode(found[21:].decode()) if found and found[:1] == b"E" else None
        if entry is not None and self.replays(entry, key):
            return entry["status"], binascii.a2b_base64(entry["body"], strict_mode=True), True
        async with self.pg.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            row = await self.pg._claim(cur, claim_params("postgres", key, path))
            if row["finished_at"] is None and self.older(entry, row["id"]):
                await self.put(redis, name, self.tombstone(row["id"]))
            if row["claimed"]:
                body = answer()
                await cur.execute(self.finish, finish_params(row, body))
                if (done := await cur.fetchone()) is None:
                    raise RuntimeError("the floor's finish matched no row")
        if row["claimed"]:
            finished = {
                **row,
                "recovery_point": "finished",
                "calling": None,
                "locked_at": None,
                "response_status": 201,
                "response_headers": self.headers,
                "response_body": body,
                "error": None,
                "finished_at": done["finished_at"],
                "expires_at": done["expires_at"],
            }
            await self.put(redis, name, self.entry(finished))
            return 201, body, False
        if row["finished_at"] is not None:
            await self.put(redis, name, self.entry(row))
        return settled(row)

    def replays(self, entry: dict[str, Any], key: str) -> bool:
        """Whether ``entry`` answers the request: the store's ``Cache.replay``."""
        return (
            entry.get("v") == 1
            and entry["scope"] == "bench"
            and entry["key"] == key
            and entry["fingerprint"] == key  # claim_params'
            and entry["finished_at"] is not None
            and self.until(entry["finished_at"], entry["expires_at"]) > time.time() * 1000
        )

    def until(self, finished: int, expires: int | None) -> int:
        """When the entry of a row finished at ``finished`` that expires at ``expires``
        (Unix microseconds) expires itself (Unix ms): the store's ``Cache._until_ms``."""
        until = finished + self.ttl
        if expires is not None:
            until = min(until, expires - self.skew)
        return until // 1000

    @staticmethod
    def older(entry: dict[str, Any] | None, key_id: int) -> bool:
        """Whether ``entry`` (read before the claim) is of a row older than ``key_id``,
        one deleted since without the cache told, which must go: the store's
        ``Cache.stale``."""
        return entry is not None and entry.get("v") == 1 and entry["id"] < key_id

    def tombstone(self, key_id: int) -> tuple[bytes, int]:
        """A tombstone refusing the entries of rows before ``key_id``, and its expiry:
        the store's ``Cache.tombstone``."""
        return b"T%020d" % key_id, int(time.time() * 1000) + (self.ttl + self.skew) // 1000

    def micros(self, value: Any) -> int | None:
        return None if value is None else (value - self.epoch) // self.microsecond

    def entry(self, row: dict[str, Any]) -> tuple[bytes, int] | None:
        """The entry of a finished key ``row`` (the key table's columns) and its expiry,
        or None too close to it: the store's ``Cache.entry``."""
        micros = self.micros
        finished, expires = micros(row["finished_at"]), micros(row["expires_at"])
        assert finished is not None
        until = self.until(finished, expires)
        if until <= time.time() * 1000:
            return None
        fields = {
            "v": 1,
            "id": row["id"],
            "scope": row["scope"],
            "key": row["key"],
            "method": row["request_method"],
            "path": row["request_path"],
            "fingerprint": row["fingerprint"],
            "params": row["request_params"],
            "flow": row["flow"],
            "point": row["recovery_point"],
            "token": row["lock_token"],
            "locked_at": micros(row["locked_at"]),
            "lock_timeout": row["lock_timeout"] // self.microsecond,
            "status": row["response_status"],
            "headers": row["response_headers"],
            "body": base64.b64encode(row["response_body"]).decode(),
            "error": row["error"],
            "created_at": micros(row["created_at"]),
            "last_run_at": micros(row["last_run_at"]),
            "finished_at": finished,
            "expires_at": expires,
            "calling": row["calling"],
        }
        return b"E%020d" % row["id"] + json.dumps(fields, separators=(",", ":")).encode(), until

    async def put(
        self, redis: RespConnection, name: bytes, entry: tuple[bytes, int] | None
    ) -> None:
        """``SET_SCRIPT`` by EVALSHA: the entry (or tombstone) stored unless a higher
        floor is there."""
        if entry is None:
            return
        stored = await redis.call(b"EVALSHA", self.redis.sha["set"], 1, name, *entry)
        if stored != 1:
            raise RuntimeError(f"the floor's entry was refused: {stored!r}")


# -- app servers ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[Any], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server on port {port} did not start")
        time.sleep(0.05)


def stop(process: subprocess.Popen[Any]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def app_server(script: str, arguments: Sequence[str]) -> Iterator[tuple[int, int]]:
    """``python SCRIPT serve --fd N ARGUMENTS`` on a socket bound here: (port, pid)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    command = [sys.executable, script, "serve", "--fd", str(sock.fileno()), *arguments]
    process = subprocess.Popen(command, pass_fds=[sock.fileno()])
    try:
        wait_for_port(port, process)
        yield port, process.pid
    finally:
        stop(process)
        sock.close()


#: ``--deploy``: how an app server runs. ``1``: one uvicorn process; ``uvicorn-N``:
#: ``uvicorn --workers N`` (uvicorn's supervisor, N spawned workers); ``gunicorn-N``:
#: ``gunicorn -w N -k uvicorn_worker.UvicornWorker`` (gunicorn's arbiter, N forked workers).
DEPLOY_HELP = "1 (one uvicorn process), uvicorn-N or gunicorn-N (N workers); repeatable"


def deployment(text: str) -> tuple[str, int]:
    """``--deploy``'s value as (kind, workers): ("uvicorn", 1) for ``1``."""
    kind, _, workers = text.rpartition("-")
    if text == "1":
        return "uvicorn", 1
    if kind in ("uvicorn", "gunicorn") and workers.isdigit() and int(workers) >= 1:
        return kind, int(workers)
    raise argparse.ArgumentTypeError(f"--deploy {text!r}: expected {DEPLOY_HELP}")


def deploy_option(text: str) -> str:
    """``--deploy``'s argparse type: the text, once :func:`deployment` reads it."""
    deployment(text)
    return text


def deploy_label(text: str) -> str:
    """How users would start it: ``1 process``, ``uvicorn --workers 2``, ``gunicorn -w 2``."""
    kind, workers = deployment(text)
    if text == "1":
        return "1 process"
    return f"uvicorn --workers {workers}" if kind == "uvicorn" else f"gunicorn -w {workers}"


def serve(factory: Callable[[], Any], fd: int, deploy: str = "1") -> None:
    """Run the app ``factory()`` builds as users deploy it (``deploy``, see
    :func:`deployment`): uvicorn with uvloop and httptools, in this process, or N
    workers that each call ``factory`` (their own app, store and pool) under uvicorn's
    supervisor (``factory`` must then pickle: spawned workers) or gunicorn's arbiter
    (forked workers), this process being the supervisor."""
    import uvicorn

    # Not uvicorn's fd= option: it wraps the descriptor as an AF_UNIX socket, so asyncio
    # never sets TCP_NODELAY on the connections, and Nagle's algorithm meets delayed
    # ACKs for 40 ms per response. socket(fileno=) reads the real family and protocol,
    # and a spawned worker gets the socket as it is (pickled with its family).
    kind, workers = deployment(deploy)
    factory = functools.partial(_frozen_after, factory)
    if kind == "gunicorn":
        return _gunicorn(factory, fd, workers)
    sock = socket.socket(fileno=fd)
    config = uvicorn.Config(
        factory, factory=True, workers=workers, loop="uvloop", http="httptools",
        log_level="warning", access_log=False,
    )  # fmt: skip
    if deploy == "1":
        uvicorn.Server(config).run(sockets=[sock])
    else:
        from uvicorn.supervisors import Multiprocess

        Multiprocess(config, sockets=[sock]).run()


def _frozen_after(factory: Callable[[], Any]) -> Any:
    """``factory()``, then the heap it leaves frozen (``gc.freeze()``, as a preloading
    deployment does): a full collection then scans what requests made, not the
    interpreter's, the framework's and the library's start-up objects. Without it a
    full collection took 40 to 60 ms here, and an endpoint that holds its objects while
    it waits for its store (the floors: the guard runs inside the endpoint) set off about
    five times as many as the guarded rows do (24 against 5 in three rounds on Redis):
    the floors' p99 was 40 ms and their req/s up to 8 % lower, in the library's favour.
    Every row of every server gets the same."""
    app = factory()
    gc.collect()
    gc.freeze()
    return app


def _gunicorn(factory: Callable[[], Any], fd: int, workers: int) -> None:
    """``gunicorn -w WORKERS -k uvicorn_worker.UvicornWorker --bind fd://FD``, in this
    process: gunicorn makes an AF_INET socket of the descriptor (TCP_NODELAY set on it,
    which the connections inherit), and each forked worker calls ``factory`` (uvicorn's
    loop and http "auto": uvloop and httptools, as installed)."""
    from gunicorn.app.base import BaseApplication

    settings = {
        "bind": [f"fd://{fd}"],
        "workers": workers,
        "worker_class": "uvicorn_worker.UvicornWorker",
        "loglevel": "warning",
        "graceful_timeout": 5,
    }

    class Deployed(BaseApplication):
        def load_config(self) -> None:
            for name, value in settings.items():
                self.cfg.set(name, value)

        def load(self) -> Any:
            return factory()

    Deployed().run()


def dispatch(routes: dict[str, Any]) -> Any:
    """One ASGI app from several, by the first segment of the path (``/PREFIX/...``);
    it answers the lifespan itself (the apps open their pools on first use)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        await routes[scope["path"].split("/", 2)[1]](scope, receive, send)

    return app


def trivial_app(guard: Callable[[Any], None], extra: Callable[..., None] | None = None) -> Any:
    """The benchmarks' app: the same trivial FastAPI endpoint (parse a JSON body, answer
    201 with a small JSON body) at ``/plain/trivial``, unguarded, and at
    ``/guarded/handler`` in a second FastAPI app that ``guard(app)`` adds a middleware
    to. ``extra(plain, guarded, Item)`` adds routes of its own to either."""
    from fastapi import FastAPI
    from pydantic import BaseModel

    class Item(BaseModel):
        amount: int

    plain, guarded = FastAPI(), FastAPI()

    @plain.post("/plain/trivial", status_code=201)
    @guarded.post("/guarded/handler", status_code=201)
    async def trivial(item: Item) -> dict[str, Any]:
        return {"ok": True, "amount": item.amount}

    if extra is not None:
        extra(plain, guarded, Item)
    guard(guarded)
    return dispatch({"plain": plain, "guarded": guarded})


def our_store(target: str, cache: str | None = None) -> Any:
    """Our async store for ``target``: what ``open_async_store`` opens for a
    ``redis://`` URL, else ``AsyncPostgresStore`` (a pool of up to 20, as the peers
    get) for a PostgreSQL URL or libpq string;
    with ``cache`` (a ``redis://`` URL), the PostgreSQL store behind
    ``AsyncCachedStore``, which serves replays from Redis."""
    from idempotence import AsyncCachedStore, open_async_store
    from idempotence.stores.postgres import AsyncPostgresStore

    if target.startswith("redis"):
        return open_async_store(target)
    primary = AsyncPostgresStore(target, max_size=20)
    return primary if cache is None else AsyncCachedStore(primary, cache)


def our_guard(store: Any, transaction_paths: Sequence[str] = ()) -> Callable[[Any], None]:
    """Adds idempotence's middleware: handler mode, request-as-transaction on the
    ``transaction_paths``, one tenant."""

    def guard(app: Any) -> None:
        from idempotence.http import (
            Endpoint,
            Idempotency,
            IdempotencyMiddleware,
            Policy,
            single_tenant,
        )

        endpoints = [
            Endpoint(f"POST {path}", Policy(transaction=True)) for path in transaction_paths
        ]
        config = Idempotency(store=store, scope=single_tenant("bench"), endpoints=endpoints)
        app.add_middleware(IdempotencyMiddleware, config=config)

    return guard


# -- rows and rounds -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: POSTs to ``path`` on the server ``server``.

    ``baseline`` names the row (same server) whose req/s and CPU this one is compared
    with, None for a baseline. ``fixed`` rows send one key throughout (replays)."""

    server: str
    name: str
    path: str
    baseline: str | None
    fixed: bool = False
    connections: int | None = None  # None: --connections
    note: str = ""

    @property
    def label(self) -> str:
        return self.name if self.connections is None else f"{self.name} @c{self.connections}"


@dataclasses.dataclass
class Server:
    name: str
    port: int
    pid: int
    meter: Meter = dataclasses.field(default_factory=Meter)
    description: str = ""


def command_line(
    doc: str,
    serve_options: Callable[[argparse.ArgumentParser], None],
    options: Callable[[argparse.ArgumentParser], None],
    app: Callable[[argparse.Namespace], Any],
) -> argparse.Namespace | None:
    """Parse an HTTP benchmark's command line. ``serve`` (internal: one app server,
    built by ``app(args)``) serves until stopped and returns None; a run gets its
    options back, --quick applied, with wrk and the dependencies in place."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    serving = sub.add_parser("serve", help="(internal) run one benchmark server")
    serving.add_argument("--fd", type=int, required=True)
    serving.add_argument("--deploy", default="1", type=deploy_option, help=DEPLOY_HELP)
    serve_options(serving)
    options(parser)
    parser.add_argument("--postgres", default=default_postgres(), help="the machine's server")
    add_options(parser)
    args = parser.parse_args()
    use_repo()
    use_deps()
    if args.command == "serve":
        # A partial, not a closure: uvicorn's supervisor pickles it for its workers.
        serve(functools.partial(app, args), args.fd, args.deploy)
        return None
    apply_quick(args)
    ensure_wrk()
    return args


def without_missing_redis(wanted: list[str], *names: str) -> list[str]:
    """``wanted`` less ``names`` (with a printed line) when this checkout has no Redis
    store: so their rows appear by themselves once the store exists."""
    skipped = [name for name in names if name in wanted]
    if skipped and (why := our_redis_missing()):
        for name in skipped:
            print(f"{name}: skipped, no Redis store in this checkout ({why})", file=sys.stderr)
        return [each for each in wanted if each not in skipped]
    return wanted


def head(args: argparse.Namespace, layout: str) -> str:
    return (
        f"uvicorn ({layout}, uvloop, httptools), FastAPI; wrk -t{args.threads} "
        f"-c{args.connections}, a unique Idempotency-Key per request; {args.seconds} s per "
        f"row x {args.rounds} interleaved rounds (medians); {os.cpu_count()} CPU cores"
    )


def add_options(parser: argparse.ArgumentParser, seconds: int = 3) -> None:
    parser.add_argument("--seconds", type=int, default=seconds, help="per row per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 3)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured seconds per row")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s, no warm-up")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def apply_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.seconds, args.rounds, args.warmup = 1, 1, 0


def measure(
    servers: dict[str, Server], rows: Sequence[Row], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every row, ``args.rounds`` times, in alternating order; medians and ratios."""
    run_id = f"{os.getpid()}-{time.time_ns()}"
    for row in rows:
        if row.fixed:
            settle(servers[row.server].port, row, f"replay-{row.server}-{row.name}")
    results: dict[Row, list[dict[str, Any]]] = {row: [] for row in rows}
    for number in range(args.rounds):
        order = rows if number % 2 == 0 else list(reversed(rows))
        for row in order:
            results[row].append(_one(servers[row.server], row, args, f"{run_id}-{number}"))
    return summarise(rows, results)


def settle(port: int, row: Row, key: str) -> None:
    """Finish a replay row's key before its rounds, so every measured request replays,
    and check that the guard does replay it (else the row would measure nothing)."""
    post(port, row.path, key)
    _, headers = post(port, row.path, key)
    # idempotence says Idempotent-Replayed, idemkit Idempotency-Replayed.
    if "true" not in (headers.get("idempotent-replayed"), headers.get("idempotency-replayed")):
        raise RuntimeError(f"{row.server} {row.label}: the second POST was not a replay")


def _one(server: Server, row: Row, args: argparse.Namespace, run: str) -> dict[str, Any]:
    key = f"fixed:replay-{row.server}-{row.name}" if row.fixed else f"{run}-{row.label}"
    connections = row.connections or args.connections
    load = functools.partial(
        run_wrk, server.port, row.path, connections=connections, refused=args.quick
    )
    if args.warmup > 0:
        load(seconds=args.warmup, threads=args.threads, key=key + "-warm")
    app_before, db_before = tree_cpu(server.pid), server.meter.snapshot()
    result = load(seconds=args.seconds, threads=args.threads, key=key)
    app_after, db_after = tree_cpu(server.pid), server.meter.snapshot()
    served = result["requests"] or 1
    if app_after:  # every process of the deployment: supervisor and workers
        result["app_ms"] = 1000 * Meter.used(app_before, app_after) / served
        result["processes"] = len(app_after)
        result["busiest"] = busiest(server.pid, app_before, app_after)
    for name, after in db_after.items():
        result[f"{name}_ms"] = 1000 * Meter.used(db_before.get(name, {}), after) / served
    return result


def busiest(root: int, before: dict[int, float], after: dict[int, float]) -> float | None:
    """The busiest worker's share of the workers' CPU in a round (None for one process).

    The workers of a deployment share one listening socket, and each accepts every
    connection waiting when it wakes: wrk's connections, opened at once and kept
    alive, can all land on one worker, which then serves the round alone while the
    other core idles. 0.5 of two workers is an even split, 1.0 one worker alone: rows
    whose splits differ do not compare."""
    used = {pid: seconds - before.get(pid, 0.0) for pid, seconds in after.items() if pid != root}
    total = sum(used.values())
    if len(used) < 2 or total <= 0:
        return None
    return max(used.values()) / total


def summarise(
    rows: Sequence[Row], results: dict[Row, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    def median(row: Row, field: str) -> float | None:
        known = [r[field] for r in results[row] if r.get(field) is not None]
        return statistics.median(known) if known else None

    by_name = {(row.server, row.label): row for row in rows}
    table = []
    for row in rows:
        rps = median(row, "rps") or 0.0
        suffix = "" if row.connections is None else f" @c{row.connections}"
        base = by_name.get((row.server, f"{row.baseline}{suffix}")) if row.baseline else None
        base_rps = median(base, "rps") if base else None
        line: dict[str, Any] = {
            "server": row.server,
            "row": row.label,
            "path": row.path,
            "baseline": base.label if base else None,
            "rps": rps,
            "ratio": rps / base_rps if base_rps else None,
            "connections": row.connections,
            "note": row.note,
        }
        for field in (
            "p50_us", "p99_us", "app_ms", "db_ms", "cluster_ms", "redis_ms", "busiest",
        ):  # fmt: skip
            line[field] = median(row, field)
        app, base_app = line["app_ms"], median(base, "app_ms") if base else None
        line["app_added_ms"] = app - base_app if app is not None and base_app else None
        spread = [r["rps"] for r in results[row]]
        line["spread"] = (max(spread) - min(spread)) / rps if rps else 0.0
        line["errors"] = sum(r["errors"] for r in results[row])
        line["non_2xx"] = sum(r["non_2xx"] for r in results[row])
        line["refused"] = next((r["refused"] for r in results[row] if r.get("refused")), None)
        line["processes"] = max((r.get("processes", 0) for r in results[row]), default=0)
        line["rounds"] = results[row]
        table.append(line)
    return table


def print_table(table: list[dict[str, Any]], servers: dict[str, Server]) -> None:
    def number(value: float | None, width: int, digits: int) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"

    columns = (
        "req/s  ratio  p50 ms  p99 ms  app ms  +app ms  db ms  all-db ms  spread  errs  procs"
        "  busiest"
    )
    for name, server in servers.items():
        lines = [row for row in table if row["server"] == name]
        if not lines:
            continue
        print(f"\n{name}: {server.description}")
        print(f"  {'row':<22} {columns}")
        for row in lines:
            known = [row[f] for f in ("db_ms", "redis_ms") if row[f] is not None]
            db = sum(known) if known else None
            print(
                f"  {row['row']:<22} {row['rps']:>5.0f} {number(row['ratio'], 6, 2)}"
                f" {number(_ms(row['p50_us']), 7, 2)} {number(_ms(row['p99_us']), 7, 2)}"
                f" {number(row['app_ms'], 7, 3)} {number(row['app_added_ms'], 8, 3)}"
                f" {number(db, 6, 3)} {number(row['cluster_ms'], 10, 3)}"
                f" {100 * row['spread']:>6.0f}% {row['errors'] + row['non_2xx']:>5}"
                f" {row['processes']:>6}"
                + (f" {'-':>8}" if row["busiest"] is None else f" {100 * row['busiest']:>7.0f}%")
                + (f"  vs {row['baseline']}" if row["baseline"] else "  (baseline)")
            )


def _ms(microseconds: float | None) -> float | None:
    return None if microseconds is None else microseconds / 1000


LEGEND = """\
req/s: median of the rounds; ratio: req/s over the baseline row's (same server, same run)
p50/p99: wrk's latency percentiles; app ms: the app server's CPU (user+system) per request,
every process of it (supervisor or arbiter and workers: procs, the processes metered);
+app ms: app ms minus the baseline's; db ms: CPU per request of the database backends
serving this benchmark's database, plus the redis-server's where Redis serves it (Redis,
a cached store); all-db ms: every process of the PostgreSQL cluster (on the shared
server, other tenants' load too); spread: (fastest - slowest round) / median; errs:
socket errors + non-2xx answers (should be 0); busiest: with several workers, the busiest
worker's share of the workers' CPU (median of the rounds; 50 % of two is an even split,
100 % one worker serving every connection while the other idles: the workers accept
wrk's connections as they wake, so the split is luck, and rows whose splits differ do
not compare)"""


def emit(
    table: list[dict[str, Any]],
    servers: dict[str, Server],
    args: Any,
    head: str,
    summary: Sequence[str] = (),
) -> None:
    """The table (and the ``summary`` lines) as text, or as JSON with ``--json``."""
    if args.json:
        meta = {name: server.description for name, server in servers.items()}
        options = {k: v for k, v in vars(args).items() if k not in ("func",)}
        found = {"servers": meta, "options": options, "rows": table, "summary": list(summary)}
        print(json.dumps(found, indent=2))
        return
    print(head)
    print_table(table, servers)
    print()
    print(LEGEND)
    if summary:
        print("\n".join(["", *summary]))
