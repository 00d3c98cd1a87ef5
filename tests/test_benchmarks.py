"""The benchmark scripts start as the README runs them (``python benchmarks/X.py``), and
the HTTP, peer and driver benchmarks measure something in a brief ``--quick`` run.

Run as a script, a file's directory comes first on ``sys.path``: a benchmark named
like a standard-library module (it was ``http.py``) would shadow it for every import
of the library, and the README's commands would fail before measuring anything.
Files named ``_*.py`` are the benchmarks' shared machinery, not scripts.

The HTTP, peer and driver runs need the benchmarks' own dependencies
(benchmarks/requirements.txt, in benchmarks/.deps) and ``wrk``, which
``bash benchmarks/setup.sh`` installs (``.ci/run`` runs it first). A test never installs
them: without them it fails, saying to run that script, and never skips. These runs
are the slow tier (``-m slow``). No number is judged here (speed is for the scripts to
print): only that every row ran, answered every request as it should, and was measured.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.consumers.broker import broker_url

#: The slow tier: every benchmark script runs in a process of its own.
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent.parent / "benchmarks"
BENCHMARKS = sorted(path for path in HERE.glob("*.py") if not path.name.startswith("_"))


def test_there_are_benchmarks():
    names = {path.name for path in BENCHMARKS}
    assert names >= {
        "store.py",
        "reaper.py",
        "http_bench.py",
        "peers.py",
        "drivers.py",
        "soak.py",
        "instruction_guard.py",
    }


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.name)
def test_a_benchmark_script_starts(script: Path):
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


SETUP = "bash benchmarks/setup.sh"


def require_benchmark_tools() -> None:
    """benchmarks/.deps current and wrk on the PATH, or the test fails naming the
    script that installs them."""
    stamp = HERE / ".deps" / ".requirements.sha256"
    wanted = hashlib.sha256((HERE / "requirements.txt").read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text().strip() != wanted:
        pytest.fail(f"the benchmarks' dependencies are missing or out of date: run `{SETUP}`")
    if shutil.which("wrk") is None:
        pytest.fail(f"wrk (the load generator) is not installed: run `{SETUP}`")


def quick(script: str, *options: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(HERE / script), "--quick", "--json", *options],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


def assert_every_row_served(rows: list[dict[str, Any]], servers: set[str]) -> None:
    assert {row["server"] for row in rows} == servers
    for row in rows:
        name = f"{row['server']} {row['row']}"
        assert row["rps"] > 0, name
        assert row["errors"] == 0, name
        # A 409, 422 or 500 would measure something else (refused: the first, with its body).
        assert row["non_2xx"] == 0, (name, row["refused"])
        assert row["app_ms"] is not None and row["app_ms"] > 0, name
        assert row["p50_us"] > 0 and row["p99_us"] >= row["p50_us"], name
        if row["baseline"] is not None:
            assert row["ratio"] is not None and row["ratio"] > 0, name


def test_http_bench_quick():
    require_benchmark_tools()
    table = quick("http_bench.py", "--server", "pg-fast", "--server", "sqlite-normal")
    rows = table["rows"]
    assert_every_row_served(rows, {"pg-fast", "sqlite-normal"})
    names = {row["row"] for row in rows if row["server"] == "pg-fast"}
    assert names == {
        "trivial",
        "insert",
        "handler",
        "handler-floor",
        "transaction",
        "transaction-floor",
        "transaction-floor-1w",
        "replay",
        "replay-floor",
        "trivial @c1",
        "handler @c1",
        "insert @c1",
        "transaction @c1",
    }
    # Below the table, every guarded row against its floor, on both servers.
    against = [line.split(" = ")[0] for line in table["summary"]]
    assert against == [
        f"{server}: {row} / {row}-floor"
        for server in ("pg-fast", "sqlite-normal")
        for row in ("handler", "replay", "transaction")
    ]
    for row in rows:
        if row["server"] == "pg-fast" and row["row"] not in ("trivial", "trivial @c1"):
            # Every row that touches PostgreSQL shows CPU in its backends.
            assert row["db_ms"] is not None and row["db_ms"] > 0, row["row"]
        if row["server"] == "sqlite-normal":
            assert row["db_ms"] is None  # SQLite runs in the app process
        assert row["busiest"] is None  # one process: no split between workers


def test_http_bench_quick_on_redis():
    """Our Redis store and the cached store (PostgreSQL behind Redis) get their rows,
    and the cached store's replays are answered by Redis: its PostgreSQL backends do
    nothing for them, while its handler rows claim and finish there."""
    require_benchmark_tools()
    table = quick("http_bench.py", "--server", "redis", "--server", "pg-fast+cache")
    rows = table["rows"]
    servers = ("redis", "pg-fast+cache")
    assert_every_row_served(rows, set(servers))
    common = {"trivial", "handler", "replay", "trivial @c1", "handler @c1"}
    # The floors: the stores' scripts, statements and commands by hand (they raise
    # unless every request was claimed and finished, or replayed, as it should be).
    floors = {"handler-floor", "replay-floor"}
    for server in servers:
        assert {row["row"] for row in rows if row["server"] == server} == common | floors
    by = {(row["server"], row["row"]): row for row in rows}
    for server, name in [(s, n) for s in servers for n in ("handler", "replay", *floors)]:
        assert by[server, name]["redis_ms"] > 0, (server, name)
    assert by["redis", "handler"]["db_ms"] is None  # no PostgreSQL on that server
    # The summary sets each guarded row against its floor, on both servers.
    against = dict(line.split(" = ") for line in table["summary"])
    assert set(against) == {
        f"{server}: {name} / {name}-floor" for server in servers for name in ("handler", "replay")
    }
    assert all(float(ratio) > 0 for ratio in against.values())
    # The cached store and its floor claim and finish on PostgreSQL, and replay from
    # Redis alone.
    for handler, replay in (("handler", "replay"), ("handler-floor", "replay-floor")):
        assert by["pg-fast+cache", handler]["db_ms"] > 0, handler
        assert by["pg-fast+cache", replay]["db_ms"] < by["pg-fast+cache", handler]["db_ms"] / 10


def test_the_cached_floor_sends_what_the_cached_store_sends(
    pg_url: str, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
):
    """The cached store's floor (``_harness.CachedHand``, http_bench.py's
    ``pg-fast+cache`` floors): a new key claimed and finished on PostgreSQL has its
    entry written to Redis byte for byte as the store writes it for that row, so the
    library reads it; a retry is answered from Redis with no statement to PostgreSQL;
    without the entry, PostgreSQL's claim answers and the entry is written again."""
    import asyncio
    import uuid

    import redis

    from idempotence.stores.cached._store_shared import DEFAULT_CLOCK_SKEW, DEFAULT_TTL, Cache
    from idempotence.stores.postgres import PostgresStore
    from tests.support.roundtrips import RoundTrips

    monkeypatch.syspath_prepend(str(HERE))
    import _harness

    key, body = f"floor-{uuid.uuid4().hex}", b'{"ok":true,"amount":100}'
    answered: list[bytes] = []

    def answer() -> bytes:
        answered.append(body)
        return body

    cache = Cache(
        redis_prefix, ttl=DEFAULT_TTL, clock_skew=DEFAULT_CLOCK_SKEW, pause=0, instrumentation=None
    )
    name = cache.name("bench", key)
    proxy = RoundTrips(pg_url)
    client = redis.Redis.from_url(redis_url)

    async def run() -> None:
        hand = _harness.CachedHand(proxy.url, redis_url, prefix=redis_prefix)
        # Every connection set up first: a request waiting for one would grow the pool,
        # whose new connection's settings could reach the server while a retry counts.
        await hand.pg.open(wait=True)
        try:
            assert await hand.guarded(key, "/plain/floor-handler", answer) == (201, body, False)
            assert answered == [body]
            with PostgresStore(pg_url) as store:
                record = store.get("bench", key)
            assert record is not None and record.finished
            stored = client.get(name)
            expected = cache.entry(record)
            assert expected is not None and stored == expected[0]
            assert client.pexpiretime(name) == expected[1]
            assert Cache.entry_record(stored) == record
            # A retry: Redis answers, PostgreSQL sees nothing, the endpoint is not run.
            before = proxy.statements
            assert await hand.guarded(key, "/plain/floor-handler", answer) == (201, body, True)
            assert proxy.statements == before and answered == [body]
            # No entry: the claim replays the finished row, whose entry is written again.
            client.delete(name)
            assert await hand.guarded(key, "/plain/floor-handler", answer) == (201, body, True)
            assert proxy.statements == before + 1 and answered == [body]
            assert client.get(name) == expected[0]
        finally:
            await hand.close()

    try:
        asyncio.run(run())
    finally:
        client.close()
        proxy.close()


def test_http_bench_quick_deployed():
    """``--deploy uvicorn-2`` (uvicorn's supervisor) and ``--deploy gunicorn-2``
    (gunicorn's arbiter, uvicorn's workers): the same rows as one process, each served
    without an error, its ratio against its baseline in the same deployment, and its
    app CPU summed over the whole process tree, supervisor and both workers
    (issue #34, item 4)."""
    require_benchmark_tools()
    deploys = ("uvicorn-2", "gunicorn-2")
    options = ["--server", "pg-fast", "--server", "redis"]
    table = quick("http_bench.py", *options, *(f"--deploy={each}" for each in deploys))
    rows = table["rows"]
    servers = {f"{server}/{each}" for server in ("pg-fast", "redis") for each in deploys}
    assert_every_row_served(rows, servers)
    for each in deploys:
        names = {row["row"] for row in rows if row["server"] == f"pg-fast/{each}"}
        assert {"handler", "replay", "transaction", "transaction-floor"} <= names
        names = {row["row"] for row in rows if row["server"] == f"redis/{each}"}
        assert {"handler", "replay", "handler-floor", "replay-floor"} <= names
    for row in rows:
        # The supervisor (or arbiter) and two workers at least, each metered.
        assert row["processes"] >= 3, (row["server"], row["row"], row["processes"])
        # How the workers shared the load: the busiest one's share of their CPU.
        assert 0.5 <= row["busiest"] <= 1.0, (row["server"], row["row"], row["busiest"])
        if row["row"] == "trivial @c1":
            # Not a speed judgement: with TCP_NODELAY lost (a socket the workers take
            # for AF_UNIX), Nagle's algorithm meets delayed ACKs, 40 ms per response.
            assert row["p50_us"] < 20_000, (row["server"], row["p50_us"])
        if row["baseline"] is not None:
            base = [b for b in rows if b["server"] == row["server"] and b["row"] == row["baseline"]]
            assert len(base) == 1, (row["server"], row["row"])
    against = {line.split(": ")[0] for line in table["summary"]}
    assert against == servers
    assert {table["servers"][name].rsplit("; ", 1)[1] for name in servers} == {
        "uvicorn --workers 2",
        "gunicorn -w 2",
    }


def test_large_table_quick():
    """Both tables served, every row measured, and the two comparisons the issue's
    targets read (full / empty, req/s and p99) printed for both guarded rows."""
    require_benchmark_tools()
    table = quick("large_table.py", "--keys", "20000")
    assert_every_row_served(table["rows"], {"empty", "full"})
    assert "20,000 keys" in table["servers"]["full"]
    compared = [line.split(":")[0] for line in table["summary"]]
    assert compared == ["handler", "transaction"]
    assert all("req/s = " in line and "p99 = " in line for line in table["summary"])


def test_peers_quick():
    require_benchmark_tools()
    guards = ["ours-pg", "idemkit-pg", "ours-redis", "idemkit-redis", "ours-cached"]
    table = quick("peers.py", *(option for g in guards for option in ("--guard", g)))
    rows = table["rows"]
    assert_every_row_served(rows, set(guards))
    by = {(row["server"], row["row"]): row for row in rows}
    for guard, name in [(g, n) for g in guards for n in ("handler", "replay")]:
        # Every guarded row shows CPU where its guard keeps its keys.
        measured = by[guard, name]["db_ms" if guard.endswith("-pg") else "redis_ms"]
        assert measured is not None and measured > 0, (guard, name)
    # The cached store claims and finishes on PostgreSQL, and replays from Redis alone.
    assert by["ours-cached", "handler"]["db_ms"] > 0
    assert by["ours-cached", "replay"]["db_ms"] < by["ours-cached", "handler"]["db_ms"] / 10
    # The summary compares us with idemkit on the same database, row by row.
    compared = {line.split(":")[0].split(None, 1)[1] for line in table["summary"]}
    assert compared == {
        "ours-pg / idemkit-pg",
        "ours-redis / idemkit-redis",
        "ours-cached / idemkit-redis",
    }
    assert len(table["summary"]) == 5  # handler and replay, and the cached replay


def test_drivers_quick():
    require_benchmark_tools()
    table = quick("drivers.py", "--tasks", "4")
    found = {(row["driver"], row["kind"], row["tasks"]) for row in table["rows"]}
    assert found == {
        (d, k, t) for d in ("psycopg", "asyncpg") for k in ("select", "pair") for t in (1, 4)
    }
    for row in table["rows"]:
        assert row["ops"] > 0 and row["client_us"] > 0 and row["server_us"] > 0, row


def test_consumers_quick():
    # Each run raises unless every message wrote its row (processed), so a floor that
    # claimed nothing, or a guard that absorbed new messages, cannot measure.
    table = quick("consumers.py", "--rounds", "1", "--amqp", broker_url())
    assert table["messages"] == 500
    assert [row["store"] for row in table["results"]] == ["postgres", "sqlite"]
    for row in table["results"]:
        for variant in ("unguarded", "guarded", "floor"):
            assert row[f"{variant}_per_s"] > 0 and row[f"{variant}_cpu_ms"] > 0, row
        assert row["ratio"] > 0 and row["floor_ratio"] > 0 and row["guarded_vs_floor"] > 0


def test_profile_request_quick_on_redis():
    """The in-process profile's Redis rows run, the floor (the store's two scripts by
    hand) included: it raises unless every request claimed a new key."""
    wanted = ["redis-trivial", "redis-floor", "redis-handler", "redis-replay"]
    done = subprocess.run(
        [sys.executable, str(HERE / "profile_request.py"), "--quick", "--json", *wanted],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["row"]: row for row in json.loads(done.stdout)}
    assert set(rows) == set(wanted)
    for name, row in rows.items():
        assert row["cpu us"] > 0, name
    assert rows["redis-floor"]["baseline"] == "redis-trivial"


def test_the_functions_benchmark_measures_every_guard():
    done = subprocess.run(
        [sys.executable, str(HERE / "functions.py"), "--seconds", "0.2", "--rounds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    measured = {(r["flavour"], r["guard"], r["row"]) for r in results if r["calls"] > 0}
    sync = {"bare", "ours", "hand", "powertools", "idemkit"}
    for row in ("execute", "replay"):
        assert {("sync", guard, row) for guard in sync} <= measured
        assert {("async", guard, row) for guard in sync - {"powertools"}} <= measured


@pytest.mark.timeout(600)  # one callgrind run: about 2 minutes on a loaded 2-core machine
def test_the_instruction_guard_counts_and_fails_a_grown_row(tmp_path: Path):
    """The CI guard for real on SQLite (no server), against a made-up baseline: the row
    that grew (from 1 instruction) fails, the rows that shrank pass, exit status 1, and
    every row is printed. The rule itself and --update's file:
    tests/unit/test_instruction_guard.py."""
    if shutil.which("valgrind") is None:
        pytest.fail(f"valgrind is not installed: run `{SETUP}`")
    baseline = tmp_path / "instructions.json"
    rows = {"sqlite handler": 1, "sqlite replay": 10**12, "sqlite transaction": 10**12}
    baseline.write_text(json.dumps({"rows": rows}))
    command = [sys.executable, str(HERE / "instruction_guard.py"), "--backend", "sqlite"]
    command += ["--baseline", str(baseline), "--requests", "20", "--warmup", "5"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=580, check=False)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    printed = {
        line.split()[1]: line for line in done.stdout.splitlines() if line.startswith("sqlite ")
    }
    assert set(printed) == {"handler", "replay", "transaction"}, done.stdout
    assert "FAILED" in printed["handler"]
    assert "FAILED" not in printed["replay"] and "FAILED" not in printed["transaction"]
    for line in printed.values():
        now = float(line.split()[3].replace(",", ""))
        assert now > 0, line  # what a guarded request adds is never nothing


def test_the_redis_server_benchmark_counts_every_phase():
    """Every phase ran on the callgrind server and on the plain one: instructions and
    commandstats' calls and microseconds for each (a script's take microseconds; PING,
    quicker than the server's whole-microsecond timer, may read 0), and a script's
    commands found inside it."""
    done = subprocess.run(
        [sys.executable, str(HERE / "redis_server.py"), "--calls", "20", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    phases = json.loads(done.stdout)
    scripts = {"claim new", "heartbeat", "finish", "claim replay", "release", "claim takeover"}
    assert scripts | {"powertools", "EVALSHA return", "PING"} <= set(phases)
    for name, phase in phases.items():
        assert phase["instructions"] > 0, name
        assert phase["calls"] >= 20, name  # every call of the phase was counted
    for name in scripts | {"powertools"}:
        assert phases[name]["usec_per_call"] > 0, name
    assert phases["claim new"]["parts"]["HSET"] > 0
    assert phases["finish"]["parts"]["HSET"] > 0
    assert phases["claim replay"]["parts"]["HMGET"] > 0
