"""What the Redis store's scripts cost redis-server, per call, against plain commands.

Run it from the repository root::

    .venv/bin/python benchmarks/redis_server.py              # 1,000 calls a phase, ~1 min
    .venv/bin/python benchmarks/redis_server.py --calls 300 --json

Two throwaway redis-servers: one under ``valgrind --tool=callgrind``, whose counters are
zeroed before each phase and dumped after it (``callgrind_control``), so a phase's
instructions are the server's work for that phase's calls alone; and one plain, whose
``INFO commandstats`` (reset before each phase) gives the microseconds per call that
Redis itself measures around each command. Instructions do not depend on the machine's
load; microseconds do.

Phases, each ``--calls`` calls from one client (``RedisStore``, sync, or redis-py):

* ``claim new``, ``finish``, ``claim replay``: the store's claim of a new key, the finish
  of that lease, a claim of the finished key (what ``@idempotent`` sends); and the
  rarer scripts: ``heartbeat`` of a held lease, ``release`` of one, and ``claim
  takeover``, a claim of a released key;
* ``powertools``: one aws-lambda-powertools ``idempotent_function`` call on a new key
  (its Redis layer: ``SET NX`` of the in-progress record, ``SET`` of the completed one),
  and ``powertools replay`` (its ``GET``);
* ``SET NX``, ``SET``: the same two commands by hand, of the values powertools sent;
* ``EVALSHA return``: a script that does nothing, the floor of any script call;
* ``PING``: the floor of any command, a round trip.

Per phase: instructions per call (the server's event loop's periodic work, serverCron,
left out: it runs by the clock, not by the calls), usec_per_call from commandstats for
the phase's top-level command, the plain server's CPU per call (user and system, from
/proc: the command and everything around it, the socket's system calls included; noisy
under load), and the split of the instructions over where they go (the client's socket
and parsing, the script engine, each command a script calls). Instructions count user
space only: the system calls of a round trip are in the CPU column alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import _harness as harness

harness.use_repo()
harness.use_deps()

os.environ.setdefault("POWERTOOLS_IDEMPOTENCY_DISABLED", "false")

PARTS = {
    "evalsha": ("evalShaCommand", "evalCommand"),
    "script commands": ("scriptCall", "luaRedisCallCommand", "luaRedisPCallCommand"),
    "TIME": ("timeCommand",),
    "HMGET": ("hmgetCommand",),
    "HGET": ("hgetCommand",),
    "HSET": ("hsetCommand",),
    "HDEL": ("hdelCommand",),
    "HINCRBY": ("hincrbyCommand",),
    "PEXPIREAT": ("pexpireatCommand",),
    "PERSIST": ("persistCommand",),
    "PUBLISH": ("publishCommand",),
    "SET": ("setCommand",),
    "GET": ("getCommand",),
    "cjson/struct": ("json_encode", "b_pack"),
    "query read+parse": ("readQueryFromClient",),
    "reply write": ("handleClientsWithPendingWritesUsingThreads", "handleClientsWithPendingWrites"),
}
"""Where a phase's instructions go: a label and the functions whose inclusive counts
it sums (redis-server 7.0's names; a name missing from a build counts nothing)."""


def inclusive(dump: str) -> dict[str, int]:
    """Each function's inclusive instructions in a callgrind dump (callgrind_annotate)."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    counts: dict[str, int] = {}
    for line in text.splitlines():
        found = re.match(r"\s*([\d,]+) \([^)]*\)\s+\S*?:(\S+) \[", line)
        if found:
            name = found.group(2)
            counts[name] = counts.get(name, 0) + int(found.group(1).replace(",", ""))
        total = re.match(r"\s*([\d,]+) \([^)]*\)\s+PROGRAM TOTALS", line)
        if total:
            counts["TOTAL"] = int(total.group(1).replace(",", ""))
    return counts


@contextlib.contextmanager
def callgrind_redis(
    folder: str,
) -> Iterator[tuple[str, int, Callable[[], None], Callable[[], str]]]:
    """A redis-server under callgrind: its URL, pid, a zero() of its counters and a
    dump() that returns the dump's file."""
    port = harness.free_port()
    out = os.path.join(folder, "callgrind.out")
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    command += [shutil.which("redis-server") or "redis-server", "--port", str(port)]
    command += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dumps = [0]

    def control(flag: str) -> None:
        subprocess.run(
            ["callgrind_control", flag, str(process.pid)], check=True, capture_output=True
        )

    def dump() -> str:
        control("-d")
        dumps[0] += 1
        name = f"{out}.{dumps[0]}"
        for _ in range(100):
            if os.path.exists(name):
                return name
            time.sleep(0.05)
        raise RuntimeError(f"callgrind wrote no {name}")

    try:
        harness.wait_for_port(port, process, seconds=60)
        yield f"redis://127.0.0.1:{port}", process.pid, lambda: control("-z"), dump
    finally:
        harness.stop(process)


def phases(url: str, calls: int) -> Iterator[tuple[str, str, Callable[[], None]]]:
    """Each phase: its name, the commandstats command it is about, and its run. A phase
    runs once its predecessor has (finish needs the claims' leases)."""
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    from idempotence import ClaimRequest, StoredResponse
    from idempotence.stores.redis import RedisStore

    store = RedisStore(f"{url}/1")
    prefix = uuid.uuid4().hex[:12]
    body = json.dumps({"order": "x" * 20, "charged": 5}).encode()
    requests = [
        ClaimRequest(scope="bench", key=f"{prefix}-{n}", fingerprint="f" * 64) for n in range(calls)
    ]
    leases: list[Any] = []
    store.claim(ClaimRequest(scope="bench", key=f"warm-{prefix}", fingerprint="f"))  # load scripts

    def claim_new() -> None:
        leases.extend(store.claim(request).lease for request in requests)

    def finish() -> None:
        for lease in leases:
            store.finish(lease, StoredResponse(200, (), body))

    def replay() -> None:
        for request in requests:
            store.claim(request)

    yield "claim new", "evalsha", claim_new
    yield "heartbeat", "evalsha", lambda: [store.heartbeat(lease) for lease in leases]
    yield "finish", "evalsha", finish
    yield "claim replay", "evalsha", replay
    # Keys claimed here, between phases (not counted), to release and take over.
    held = [
        ClaimRequest(scope="bench", key=f"{prefix}-held-{n}", fingerprint="f" * 64)
        for n in range(calls)
    ]
    released = [store.claim(request).lease for request in held]
    yield "release", "evalsha", lambda: [store.release(lease) for lease in released]
    yield "claim takeover", "evalsha", lambda: [store.claim(request) for request in held]

    client = redis.Redis.from_url(f"{url}/3")
    sent: list[tuple[int, bool]] = []  # powertools' values: their size, and whether NX
    plain_set = client.set

    def watched_set(*args: Any, **kwargs: Any) -> Any:
        sent.append((len(kwargs["value"]), bool(kwargs.get("nx"))))
        return plain_set(*args, **kwargs)

    client.set = watched_set  # type: ignore[method-assign]
    layer = RedisCachePersistenceLayer(client=client)
    config = IdempotencyConfig(event_key_jmespath="order_id")

    @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
    def powertools(order: dict[str, Any]) -> dict[str, Any]:
        return {"order": order["order_id"], "charged": order["amount"]}

    powertools(order={"order_id": f"warm-{prefix}", "amount": 5})
    yield (
        "powertools",
        "set",
        lambda: [
            powertools(order={"order_id": f"{prefix}-{n}", "amount": 5}) for n in range(calls)
        ],
    )
    yield (
        "powertools replay",
        "get",
        lambda: [
            powertools(order={"order_id": f"{prefix}-{n}", "amount": 5}) for n in range(calls)
        ],
    )
    nx_size = next(size for size, nx in sent if nx)
    set_size = next(size for size, nx in sent if not nx)
    raw = redis.Redis.from_url(f"{url}/4")
    yield (
        f"SET NX ({nx_size} B)",
        "set",
        lambda: [raw.set(f"{prefix}-{n}", b"v" * nx_size, ex=3600, nx=True) for n in range(calls)],
    )
    yield (
        f"SET ({set_size} B)",
        "set",
        lambda: [raw.set(f"{prefix}-{n}", b"w" * set_size, ex=3600) for n in range(calls)],
    )
    empty = raw.register_script("return 1")
    empty()
    yield "EVALSHA return", "evalsha", lambda: [empty() for _ in range(calls)]
    yield "PING", "ping", lambda: [raw.ping() for _ in range(calls)]


def usec_per_call(url: str, command: str) -> tuple[float, int, dict[str, float]]:
    """commandstats: the command's usec_per_call and calls, and every command's
    usec_per_call (a script's commands are counted under their own names too). A command
    quicker than a microsecond (PING) may read 0: the server times each call in whole
    microseconds."""
    import redis

    stats = redis.Redis.from_url(url).info("commandstats")
    per = {name.removeprefix("cmdstat_"): row["usec_per_call"] for name, row in stats.items()}
    calls = int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
    return per.get(command, 0.0), calls, per


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per phase")
    parser.add_argument("--json", action="store_true", help="print the measures as JSON")
    args = parser.parse_args()
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as folder, callgrind_redis(folder) as (url, _, zero, dump):
        for name, _, run in phases(url, args.calls):
            zero()
            run()
            counts = inclusive(dump())
            total = counts.get("TOTAL", 0) - counts.get("serverCron", 0)
            measured[name] = {
                "instructions": total / args.calls,
                "parts": {
                    part: sum(counts.get(f, 0) for f in names) / args.calls
                    for part, names in PARTS.items()
                },
            }
    with harness.throwaway_redis() as (url, pid):
        import redis

        admin = redis.Redis.from_url(url)
        for name, command, run in phases(url, args.calls):
            admin.config_resetstat()
            cpu = harness.cpu_seconds(pid) or 0.0
            run()
            used = (harness.cpu_seconds(pid) or 0.0) - cpu
            usec, calls, per = usec_per_call(url, command)
            measured[name]["usec_per_call"] = usec
            measured[name]["calls"] = calls
            measured[name]["server_cpu_us"] = used / args.calls * 1e6
            measured[name]["commandstats"] = per
    if args.json:
        print(json.dumps(measured, indent=1))
        return 0
    print(f"{args.calls} calls a phase; load average {os.getloadavg()[0]:.2f}")
    print(
        f"{'phase':22} {'instr/call':>11} {'usec/call':>9} {'CPU us/call':>11}"
        "   where (instructions/call)"
    )
    for name, row in measured.items():
        parts = ", ".join(f"{p} {v:,.0f}" for p, v in row["parts"].items() if v >= 50)
        print(
            f"{name:22} {row['instructions']:11,.0f} {row['usec_per_call']:9.2f} "
            f"{row['server_cpu_us']:11.1f}   {parts}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
