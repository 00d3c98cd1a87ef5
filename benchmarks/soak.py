"""A soak run: the Rocket Rides stack under mixed load, crashes and retries, watched
for growth.

Run it from the repository root::

    .venv/bin/python benchmarks/soak.py                    # PostgreSQL, 10 minutes
    .venv/bin/python benchmarks/soak.py --quick            # about 30 seconds
    .venv/bin/python benchmarks/soak.py --backend sqlite --minutes 30 --json

It starts the demo's own stack (``rocket_rides.run.start_stack``: the fake payment
provider, three API workers, the background worker with its reaper, under one
supervisor that restarts whatever dies) on a database of its own: on PostgreSQL
``idempotence_soak_<pid>`` (``--postgres URL``, default ``$IDEMPOTENCE_TEST_POSTGRES``,
else ``postgresql://postgres@127.0.0.1:5432/postgres``), created and dropped here; on
SQLite a file in a temporary directory. Two groups of the demo's own clients
(``rocket_rides.clients``) book rides, batch after batch, until the time is up:

* the *steady* group on the first API worker, which never gets a crash order, so its
  process lives through the whole run and its memory can be judged;
* the *crash* group on the other two, with ``--crash-rate`` of its requests ordering
  the worker to SIGKILL itself at a random point of the ride (``rocket_rides.chaos``);
  their retries take the keys over.

Keys are kept ``--retention`` seconds and the reaper runs every ``--reaper-interval``
seconds, so that it works all along. Every ``--sample`` seconds the script records the
RSS and open file descriptors of every process of the stack (by its current pid: a
restarted worker is followed under its new pid), the connections to the soak's
database (``pg_stat_activity``), the key table's rows and bytes, and the rides booked;
every answer's status and latency is recorded as it arrives.

The verdict (exit 1 when it fails, with what failed):

* any 5xx answer;
* an answer that means a bug (the demo clients' ``unexpected``), or a replay that
  differs from its first answer;
* growth: over the judged window (the second half of the run, after ``--warm-up``), a
  least-squares slope above ``--max-rss-growth`` MB per hour for the RSS of a process
  that lived through the window, or above ``--max-fd-growth`` per hour for its file
  descriptors or for the database's connections;
* the key table above its bound at any sample: 1.25 x the rides booked in the last
  ``W`` seconds + 50, where ``W`` is the longest a key can live (retention while
  pending or until the completer finishes it, then retention again, then a reaper
  pass); and, once the run is longer than a retention and a reaper pass, as many key
  rows as rides booked (the reaper deleted nothing);
* the key table's bytes growing faster than ``--max-key-growth`` MB per hour, unless
  PostgreSQL's autovacuum is off (nothing reclaims deleted rows' space then).

Linux only (it reads ``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from rocket_rides.clients import RETRY, ClientStats, make_workload, run_clients
from rocket_rides.provider import Faults
from rocket_rides.run import StackProcess, free_port, start_stack
from rocket_rides.stack import StackConfig

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
#: A rider's key may outlive its retention by this much: a key unfinished when its
#: client gives up waits for the completer (its grace, its lock, a pass or two).
RIDE_LIFE = RETRY.deadline.total_seconds() + 10.0
BOUND_FACTOR = 1.25
BOUND_SLACK = 50
#: A slope over a shorter window is noise extrapolated to an hour: not judged.
MIN_WINDOW = 120.0


# -- what is measured ---------------------------------------------------------------------


@dataclass
class Sample:
    """One look at the stack, ``t`` seconds into the run."""

    t: float
    #: name -> [pid, RSS bytes, open file descriptors]
    processes: dict[str, list[int]]
    connections: int | None
    key_rows: int
    key_bytes: int
    rides: int
    #: PostgreSQL: the key table's heap and index bytes, dead rows, vacuums so far.
    detail: dict[str, int] = field(default_factory=dict)


@dataclass
class Timing:
    """One answer: when it was asked (seconds into the run), how long it took."""

    t: float
    seconds: float
    status: int


@dataclass
class Totals:
    """The clients' counts, summed over every batch of rides."""

    requests: int = 0
    crash_orders: int = 0
    dropped: int = 0
    timeouts: int = 0
    rides: int = 0
    gave_up: int = 0
    abandoned: int = 0
    replays_checked: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    replay_mismatches: list[str] = field(default_factory=list)

    def add(self, stats: ClientStats) -> None:
        self.requests += stats.requests
        self.crash_orders += stats.crash_orders
        self.dropped += stats.dropped
        self.timeouts += stats.timeouts
        self.rides += len(stats.outcomes)
        self.gave_up += len(stats.gave_up)
        self.abandoned += len(stats.abandoned)
        self.replays_checked += stats.replays_checked
        self.statuses.update(stats.statuses)
        self.unexpected += [f"{key}: {status} {body}" for key, status, body in stats.unexpected]
        self.replay_mismatches += stats.replay_mismatches


@dataclass(frozen=True)
class Limits:
    """What the verdict allows."""

    warm_up: float
    rss_mb_per_hour: float
    fd_per_hour: float
    #: The longest a key can live, seconds (see the module docstring).
    key_life: float
    #: By then the reaper must have deleted a key: the first finished keys' retention,
    #: a reaper pass, and a ride's few seconds.
    first_reap: float
    key_mb_per_hour: float = 20.0
    #: False where nothing reclaims deleted rows' space (PostgreSQL's autovacuum off).
    judge_key_bytes: bool = True


# -- the verdict (pure) ---------------------------------------------------------------------


def slope(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of ``points`` (x, y), per unit of x; 0 for < 3 points."""
    if len(points) < 3:
        return 0.0
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    if spread == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread


def judged(samples: Sequence[Sample], warm_up: float) -> list[Sample]:
    """The samples growth is judged on: the second half of the run, after warm-up."""
    if not samples:
        return []
    start = max(warm_up, samples[-1].t / 2)
    return [s for s in samples if s.t >= start]


def span(window: Sequence[Sample]) -> float:
    return window[-1].t - window[0].t if window else 0.0


def process_rows(samples: Sequence[Sample], limits: Limits) -> list[dict[str, Any]]:
    """Per process: pids seen, RSS and descriptors at start, end and max, and their
    slopes per hour over the judged window when one pid lived through all of it
    (``judged`` when the window is also long enough)."""
    window = judged(samples, limits.warm_up)
    names = sorted({name for s in samples for name in s.processes})
    rows = []
    for name in names:
        seen = [(s.t, *s.processes[name]) for s in samples if name in s.processes]
        late = [(s.t, *s.processes[name]) for s in window if name in s.processes]
        steady = len(late) >= 3 and len({pid for _, pid, _, _ in late}) == 1
        row: dict[str, Any] = {
            "process": name,
            "pids": len({pid for _, pid, _, _ in seen}),
            "rss_start_mb": seen[0][2] / 1e6,
            "rss_end_mb": seen[-1][2] / 1e6,
            "rss_max_mb": max(rss for _, _, rss, _ in seen) / 1e6,
            "fds_start": seen[0][3],
            "fds_end": seen[-1][3],
            "judged": steady and span(window) >= MIN_WINDOW,
            "rss_mb_per_hour": None,
            "fds_per_hour": None,
        }
        if steady:
            row["rss_mb_per_hour"] = slope([(t, rss / 1e6) for t, _, rss, _ in late]) * 3600
            row["fds_per_hour"] = slope([(t, fds) for t, _, _, fds in late]) * 3600
        rows.append(row)
    return rows


def key_bounds(samples: Sequence[Sample], key_life: float) -> list[int]:
    """Per sample, the most key rows the table may hold: every ride booked in the last
    ``key_life`` seconds may still have its key, with a margin."""
    bounds = []
    for sample in samples:
        before = [s.rides for s in samples if s.t <= sample.t - key_life]
        recent = sample.rides - (before[-1] if before else 0)
        bounds.append(int(BOUND_FACTOR * recent) + BOUND_SLACK)
    return bounds


def failures(samples: Sequence[Sample], totals: Totals, limits: Limits) -> list[str]:
    """What failed; an empty list is a pass."""
    failed = []
    errors = {status: n for status, n in totals.statuses.items() if status >= 500}
    if errors:
        failed.append(f"5xx answers: {dict(sorted(errors.items()))}")
    if totals.unexpected:
        failed.append(f"{len(totals.unexpected)} unexpected answers, first: {totals.unexpected[0]}")
    if totals.replay_mismatches:
        failed.append(f"{len(totals.replay_mismatches)} replays differ from their first answer")
    for row in process_rows(samples, limits):
        if row["judged"] and row["rss_mb_per_hour"] > limits.rss_mb_per_hour:
            failed.append(
                f"{row['process']}: RSS grows {row['rss_mb_per_hour']:.1f} MB/h"
                f" (limit {limits.rss_mb_per_hour:g})"
            )
        if row["judged"] and row["fds_per_hour"] > limits.fd_per_hour:
            failed.append(
                f"{row['process']}: file descriptors grow {row['fds_per_hour']:.0f}/h"
                f" (limit {limits.fd_per_hour:g})"
            )
    window = judged(samples, limits.warm_up)
    held = [(s.t, float(s.connections)) for s in window if s.connections is not None]
    if span(window) >= MIN_WINDOW and slope(held) * 3600 > limits.fd_per_hour:
        failed.append(
            f"database connections grow {slope(held) * 3600:.0f}/h (limit {limits.fd_per_hour:g})"
        )
    grows = slope([(s.t, s.key_bytes / 1e6) for s in window]) * 3600
    if limits.judge_key_bytes and span(window) >= MIN_WINDOW and grows > limits.key_mb_per_hour:
        failed.append(
            f"key table: its bytes grow {grows:.1f} MB/h (limit {limits.key_mb_per_hour:g})"
        )
    for sample, bound in zip(samples, key_bounds(samples, limits.key_life), strict=True):
        if sample.key_rows > bound:
            failed.append(
                f"key table: {sample.key_rows} rows at {sample.t:.0f} s, above its bound"
                f" {bound} (rides booked in the last {limits.key_life:.0f} s x {BOUND_FACTOR}"
                f" + {BOUND_SLACK}): the reaper falls behind"
            )
            break
    last = samples[-1] if samples else None
    if last is not None and last.t > limits.first_reap and last.key_rows >= last.rides:
        failed.append(
            f"the reaper deleted nothing: {last.key_rows} key rows for {last.rides} rides"
        )
    return failed


def percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def minute_rows(samples: Sequence[Sample], timings: Sequence[Timing]) -> list[dict[str, Any]]:
    """Per minute of the run: answers, 5xx, latency p50/p99, and the last sample's key
    table and connections."""
    if not samples:
        return []
    rows = []
    for minute in range(int(samples[-1].t // 60) + 1):
        mine = [x for x in timings if minute * 60 <= x.t < (minute + 1) * 60]
        seen = [s for s in samples if s.t < (minute + 1) * 60]
        last = seen[-1]
        latencies = [x.seconds * 1000 for x in mine]
        rows.append(
            {
                "minute": minute + 1,
                "answers": len(mine),
                "5xx": sum(1 for x in mine if x.status >= 500),
                "p50_ms": percentile(latencies, 0.50),
                "p99_ms": percentile(latencies, 0.99),
                "key_rows": last.key_rows,
                "key_mb": last.key_bytes / 1e6,
                "connections": last.connections,
                "rides": last.rides,
            }
        )
    return rows


# -- sampling -----------------------------------------------------------------------------


def proc_stats(pid: int) -> tuple[int, int] | None:
    """RSS in bytes and open file descriptors of ``pid``; None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        return kb * 1024, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return None


POSTGRES_PROBE = """
SELECT (SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()),
    (SELECT count(*) FROM idempotency_keys),
    pg_total_relation_size('idempotency_keys'),
    (SELECT coalesce(max(id), 0) FROM rocket_rides),
    pg_relation_size('idempotency_keys'),
    pg_indexes_size('idempotency_keys'),
    n_dead_tup,
    vacuum_count + autovacuum_count
FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'
"""


def with_dbname(server: str, name: str) -> str:
    """The URL of database ``name`` on ``server`` (a URL or a key=value conninfo)."""
    if "://" in server:
        return urllib.parse.urlunsplit(urllib.parse.urlsplit(server)._replace(path="/" + name))
    info = conninfo_to_dict(server)
    user = urllib.parse.quote(str(info.get("user", "postgres")))
    if "password" in info:
        user += ":" + urllib.parse.quote(str(info["password"]))
    host, port = info.get("host", "127.0.0.1"), info.get("port", 5432)
    return f"postgresql://{user}@{host}:{port}/{name}"


class Database:
    """The soak's database, created and dropped here, and the queries that watch it."""

    def __init__(self, backend: str, postgres: str, data_dir: str) -> None:
        self.backend = backend
        self.admin = postgres
        self.name = f"idempotence_soak_{os.getpid()}"
        #: Whether PostgreSQL's autovacuum runs (None on SQLite, which needs none).
        self.autovacuum: bool | None = None
        if backend == "postgres":
            self.url = with_dbname(postgres, self.name)
        else:
            self.path = Path(data_dir).resolve() / "soak.sqlite3"
            self.url = f"sqlite:///{self.path}"

    @contextlib.contextmanager
    def created(self) -> Iterator[Database]:
        if self.backend != "postgres":
            yield self
            return
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
            shown = conn.execute("SHOW autovacuum").fetchone()
            self.autovacuum = shown is not None and shown[0] == "on"
        try:
            yield self
        finally:
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(self.name)
                    )
                )

    def probe(self) -> Callable[[], tuple[int | None, int, int, int, dict[str, int]]]:
        """A function returning (connections, key rows, key bytes, rides, detail)."""
        if self.backend == "postgres":
            conn = psycopg.connect(self.url, autocommit=True)

            def postgres() -> tuple[int | None, int, int, int, dict[str, int]]:
                row = conn.execute(POSTGRES_PROBE).fetchone()
                assert row is not None
                connections, rows, size, rides, heap, indexes, dead, vacuums = map(int, row)
                detail = {"heap": heap, "indexes": indexes, "dead": dead, "vacuums": vacuums}
                return connections, rows, size, rides, detail

            return postgres
        lite = sqlite3.connect(
            f"file:{self.path}?mode=ro", uri=True, timeout=10, check_same_thread=False
        )

        try:
            dbstat = bool(lite.execute("SELECT count(*) FROM dbstat LIMIT 1").fetchone())
        except sqlite3.OperationalError:
            dbstat = False

        def sqlite() -> tuple[int | None, int, int, int, dict[str, int]]:
            rows = lite.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0]
            rides = lite.execute("SELECT coalesce(max(id), 0) FROM rocket_rides").fetchone()[0]
            if dbstat:
                size = lite.execute(
                    "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN"
                    " (SELECT name FROM sqlite_master WHERE tbl_name = 'idempotency_keys')"
                ).fetchone()[0]
            else:  # no dbstat in this build of SQLite: the whole file
                size = self.path.stat().st_size
            return None, int(rows), int(size), int(rides), {}

        return sqlite


class Sampler(threading.Thread):
    """Looks at the stack every ``every`` seconds until stopped."""

    def __init__(
        self, stack: StackProcess, names: dict[str, str], probe: Callable[[], Any], every: float
    ) -> None:
        super().__init__(daemon=True)
        self.stack, self.names, self.probe, self.every = stack, names, probe, every
        self.samples: list[Sample] = []
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.samples.append(self.look())
            except Exception as exc:  # a probe that fails ends the watch, loudly
                self.error = exc
                return
            self.stop.wait(self.every)

    def look(self) -> Sample:
        t = time.monotonic() - self.started
        pids: dict[str, int] = {"supervisor": self.stack.process.pid}
        for name, pid in dict(self.stack.pids).items():  # a copy: the reader updates it
            pids[self.names.get(name, name)] = pid
        processes = {}
        for name, pid in pids.items():
            stats = proc_stats(pid)
            if stats is not None:
                processes[name] = [pid, *stats]
        connections, rows, size, rides, detail = self.probe()
        return Sample(round(t, 2), processes, connections, rows, size, rides, detail)


# -- the load -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    name: str
    urls: tuple[str, ...]
    clients: int
    crash_rate: float


async def drive(
    groups: Sequence[Group], seconds: float, started: float, seed: int
) -> tuple[Totals, list[Timing]]:
    """Book rides in batches, in every group at once, until ``seconds`` have passed."""
    totals = Totals()
    timings: list[Timing] = []

    async def asked(request: httpx.Request) -> None:
        request.extensions["soak_asked"] = time.monotonic()

    async def answered(response: httpx.Response) -> None:
        asked_at = response.request.extensions["soak_asked"]
        timings.append(
            Timing(asked_at - started, time.monotonic() - asked_at, response.status_code)
        )

    hooks: dict[str, list[Callable[..., Any]]] = {"request": [asked], "response": [answered]}
    deadline = time.monotonic() + seconds
    rng = random.Random(seed)

    async def loop(group: Group) -> None:
        batch = 0
        while time.monotonic() < deadline:
            workload = make_workload(
                run=f"{group.name}{batch}",
                rides=group.clients * 5,
                clients=group.clients,
                crash_rate=group.crash_rate,
                declined_rate=0.1,
                seed=rng.randrange(2**31),
                abandon_rate=0.02,
            )
            totals.add(await run_clients(workload, group.urls, event_hooks=hooks))
            batch += 1

    await asyncio.gather(*(loop(group) for group in groups))
    return totals, timings


# -- the run ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length (default 10)")
    parser.add_argument("--quick", action="store_true", help="a smoke run of about 30 s")
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("IDEMPOTENCE_TEST_POSTGRES", DEFAULT_POSTGRES),
        help="a server URL; the soak creates and drops a database of its own there",
    )
    parser.add_argument("--clients", type=int, default=8, help="half steady, half crashing")
    parser.add_argument("--crash-rate", type=float, default=0.05, help="of the crash group")
    parser.add_argument("--retention", type=float, help="key retention, s (default 60)")
    parser.add_argument("--reaper-interval", type=float, help="s between passes (default 10)")
    parser.add_argument("--sample", type=float, help="s between samples (default 5)")
    parser.add_argument("--warm-up", type=float, help="s never judged (default 60)")
    parser.add_argument("--max-rss-growth", type=float, default=60.0, help="MB/h (default 60)")
    parser.add_argument("--max-fd-growth", type=float, default=60.0, help="per h (default 60)")
    parser.add_argument(
        "--max-key-growth", type=float, default=20.0, help="key table MB/h (default 20)"
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {
        "retention": 15.0 if quick else 60.0,
        "reaper_interval": 3.0 if quick else 10.0,
        "sample": 2.0 if quick else 5.0,
        "warm_up": 10.0 if quick else 60.0,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if quick:
        args.minutes = 0.5
    return args


def stack_config(args: argparse.Namespace, database: str, data_dir: str, seed: int) -> StackConfig:
    lock_timeout = 1.0
    return StackConfig(
        database=database,
        data_dir=data_dir,
        api_ports=(free_port(), free_port(), free_port()),
        provider_port=free_port(),
        chaos=True,
        lock_timeout=lock_timeout,
        completer_grace=lock_timeout + 1.0,
        service_interval=0.5,
        retention=args.retention,
        reaper_interval=args.reaper_interval,
        # Provider faults answer 5xx by design (R5): the soak injects crashes only.
        faults=Faults(latency=0.01),
        seed=seed,
    )


def limits_of(args: argparse.Namespace, autovacuum: bool | None) -> Limits:
    key_life = (
        args.retention
        + max(args.retention, RIDE_LIFE)
        + args.reaper_interval * 1.25
        + 2 * args.sample
    )
    return Limits(
        args.warm_up,
        args.max_rss_growth,
        args.max_fd_growth,
        key_life,
        args.retention + args.reaper_interval * 1.25 + 2 * args.sample + 5.0,
        args.max_key_growth,
        judge_key_bytes=autovacuum is not False,
    )


def soak(args: argparse.Namespace) -> dict[str, Any]:
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    with tempfile.TemporaryDirectory(prefix="idempotence-soak-") as data_dir:
        database = Database(args.backend, args.postgres, data_dir)
        config = stack_config(args, database.url, data_dir, seed)
        ports = config.api_ports
        names = {f"provider:{config.provider_port}": "provider", "worker": "worker"}
        names |= {f"api:{port}": f"api-{n + 1}" for n, port in enumerate(ports)}
        steady = Group("steady", (f"http://{config.host}:{ports[0]}",), args.clients // 2, 0.0)
        crash = Group(
            "crash",
            tuple(f"http://{config.host}:{p}" for p in ports[1:]),
            args.clients - steady.clients,
            args.crash_rate,
        )
        log_path = Path(data_dir) / "processes.log"
        with (
            database.created(),
            open(log_path, "wb") as log,
            start_stack(config, log) as stack,
        ):
            sampler = Sampler(stack, names, database.probe(), args.sample)
            sampler.start()
            totals, timings = asyncio.run(
                drive([steady, crash], args.minutes * 60, sampler.started, seed)
            )
            sampler.stop.set()
            sampler.join()
            sampler.samples.append(sampler.look())
            stack_failed = stack.failed
            crashes, restarts = stack.crashes, stack.restarts
        log_tail = log_path.read_text(errors="replace").splitlines()[-20:]
    limits = limits_of(args, database.autovacuum)
    samples = sampler.samples
    window = judged(samples, limits.warm_up)
    failed = failures(samples, totals, limits)
    if sampler.error is not None:
        failed.append(f"sampling failed: {sampler.error!r}")
    if stack_failed:
        failed.append(f"the stack gave up restarting {stack_failed}")
    return {
        "settings": {
            "backend": args.backend,
            "database": database.name if args.backend == "postgres" else str(database.path),
            "minutes": args.minutes,
            "clients": args.clients,
            "crash_rate": args.crash_rate,
            "retention": args.retention,
            "reaper_interval": args.reaper_interval,
            "seed": seed,
            "autovacuum": database.autovacuum,
            **asdict(limits),
        },
        "crashes": crashes,
        "restarts": restarts,
        "totals": {**asdict(totals), "statuses": dict(sorted(totals.statuses.items()))},
        "processes": process_rows(samples, limits),
        "minutes": minute_rows(samples, timings),
        "key_bounds": key_bounds(samples, limits.key_life),
        "judged_window": [window[0].t, window[-1].t] if window else [0.0, 0.0],
        "samples": [asdict(s) for s in samples],
        "failures": failed,
        "passed": not failed,
        "log_tail": log_tail if failed else [],
    }


def _cell(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(result: dict[str, Any]) -> str:
    s, t = result["settings"], result["totals"]
    lines = [
        f"soak on {s['backend']}: {s['minutes']:g} min, {s['clients']} clients, crash rate"
        f" {s['crash_rate']:g}, retention {s['retention']:g} s, reaper every"
        f" {s['reaper_interval']:g} s, seed {s['seed']}",
        f"requests {t['requests']}, rides {t['rides']}, statuses {t['statuses']}, dropped"
        f" {t['dropped']}, timeouts {t['timeouts']}, gave up {t['gave_up']}, abandoned"
        f" {t['abandoned']}; workers killed {result['crashes']}, restarts {result['restarts']}",
        "",
        f"{'minute':>6} {'answers':>8} {'5xx':>4} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'rides':>7} {'key rows':>9} {'key MB':>7} {'db conns':>8}",
    ]
    for row in result["minutes"]:
        lines.append(
            f"{row['minute']:>6} {row['answers']:>8} {row['5xx']:>4} {row['p50_ms']:>8.1f}"
            f" {row['p99_ms']:>8.1f} {row['rides']:>7} {row['key_rows']:>9}"
            f" {row['key_mb']:>7.2f} {_cell(row['connections'], '>8')}"
        )
    lines += [
        "",
        f"{'process':<10} {'pids':>4} {'RSS MB start':>12} {'end':>6} {'max':>6}"
        f" {'MB/h':>7} {'fds start':>9} {'end':>4} {'fds/h':>6}",
    ]
    for row in result["processes"]:
        lines.append(
            f"{row['process']:<10} {row['pids']:>4} {row['rss_start_mb']:>12.1f}"
            f" {row['rss_end_mb']:>6.1f} {row['rss_max_mb']:>6.1f}"
            f" {_cell(row['rss_mb_per_hour'], '>7.1f')} {row['fds_start']:>9}"
            f" {row['fds_end']:>4} {_cell(row['fds_per_hour'], '>6.0f')}"
        )
    window = result["judged_window"]
    lines.append(
        f"MB/h, fds/h: slopes over the judged window ({window[0]:.0f}-{window[1]:.0f} s),"
        " for a process that lived through it ('-': restarted by crashes)"
    )
    if window[1] - window[0] < MIN_WINDOW:
        lines.append(f"growth not judged: the window is shorter than {MIN_WINDOW:.0f} s")
    if s["autovacuum"] is False:
        lines.append(
            "autovacuum is off on this server: nothing reclaims the space of deleted keys,"
            " so the key table's bytes are reported, not judged"
        )
    lines.append("")
    if result["passed"]:
        lines.append("verdict: PASS")
    else:
        lines.append("verdict: FAIL")
        lines += [f"  - {failure}" for failure in result["failures"]]
        lines += ["processes' log ends with:", *result["log_tail"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = soak(args)
    print(json.dumps(result, indent=1) if args.json else report(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
