"""A guarded function's cost, side by side in one run: ``@idempotent`` against the bare
function, the same claim and finish written by hand (the floor), aws-lambda-powertools'
``idempotent_function`` (its Redis persistence layer) and idemkit's decorator, all on
one throwaway redis-server (a database number each).

Run it from the repository root::

    .venv/bin/python benchmarks/functions.py              # 5 rounds of 2 s a row, ~3 min
    .venv/bin/python benchmarks/functions.py --quick      # 1 round of 1 s a row
    .venv/bin/python benchmarks/functions.py --rounds 3 --seconds 1 --json

The peers are never the package's dependencies: benchmarks/requirements.txt is
installed into benchmarks/.deps (see _harness.py) and put last on ``sys.path``.

Rows: ``execute`` (a new key every call: claim, run, store) and ``replay`` (one key
throughout: the stored result). Each guard is called in a loop by one caller for the
row's duration; ``calls/s`` is the calls it completed, ``CPU/call`` the process's CPU
time (every thread: powertools and idemkit's sync decorator run work on threads) per
call, ``redis CPU/call`` the throwaway redis-server's (what the guard's commands and
scripts cost the server; not with ``--redis``).

Every row runs once per round, the guards in alternating order from one round to the
next (so a guard is not always measured just after the same one, on a machine whose
load drifts); the table gives each row's median over the rounds, and the summary ours
against each other guard, as medians of the same-round ratios.

Sync guards: ours (``RedisStore``), hand (the same ``RedisStore`` claim and finish
written out), powertools (sync only), idemkit (``idempotent_sync``, which runs
its engine on a loop thread). Async guards: ours (``AsyncRedisStore``), hand, idemkit
(``idempotent``). The function returns a small dict.

``--count`` runs each child with ``PYTHONHASHSEED=0``: string hashes, and so the
dictionaries' and sets' probing, are the same in every run, so a row no longer moves
by several thousand instructions from one run to the next.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import _harness as harness

harness.use_repo()
harness.use_deps()

os.environ.setdefault("POWERTOOLS_IDEMPOTENCY_DISABLED", "false")


ROWS = ("execute", "replay")


@dataclass
class Result:
    flavour: str
    guard: str
    row: str
    calls: int
    seconds: float
    cpu: float
    server_cpu: float | None = None
    """The redis-server's CPU over the row (None when it is not ours to watch)."""

    @property
    def rate(self) -> float:
        return self.calls / self.seconds

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.calls * 1e6

    @property
    def server_us(self) -> float | None:
        return None if self.server_cpu is None else self.server_cpu / self.calls * 1e6


SERVER_PID: int | None = None
"""The throwaway redis-server's pid, whose CPU each row reports too."""


def _server_cpu() -> float:
    return (harness.cpu_seconds(SERVER_PID) or 0.0) if SERVER_PID is not None else 0.0


def _order(order_id: str, amount: int) -> dict[str, Any]:
    return {"order": order_id, "charged": amount}


def _fingerprint(order_id: str, amount: int) -> str:
    body = json.dumps({"amount": amount, "order_id": order_id}, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


# -- sync guards ------------------------------------------------------------------------------


def own_sync_guards(url: str) -> dict[str, tuple[Callable[[str], Any], Callable[[], None]]]:
    """The bare function, ours and the hand-written floor, sync: a call taking the key,
    and its close."""
    from idempotence import ClaimRequest, Outcome, StoredResponse, idempotent
    from idempotence.stores.redis import RedisStore

    guards: dict[str, tuple[Callable[[str], Any], Callable[[], None]]] = {}
    guards["bare"] = (lambda key: _order(key, 5), lambda: None)

    ours_store = RedisStore(f"{url}/1")
    ours = idempotent(ours_store, key="order_id", name="bench")(_order)
    guards["ours"] = (lambda key: ours(key, 5), ours_store.close)

    hand_store = RedisStore(f"{url}/2")

    def hand(key: str) -> Any:
        request = ClaimRequest(scope="bench", key=key, fingerprint=_fingerprint(key, 5))
        claim = hand_store.claim(request)
        if claim.outcome is Outcome.REPLAY:
            assert claim.response is not None
            return json.loads(claim.response.body)
        assert claim.outcome is Outcome.EXECUTE
        assert claim.lease is not None
        value = _order(key, 5)
        hand_store.finish(claim.lease, StoredResponse(200, (), json.dumps(value).encode()))
        return value

    guards["hand"] = (hand, hand_store.close)
    return guards


def sync_guards(url: str) -> dict[str, tuple[Callable[[str], Any], Callable[[], None]]]:
    """Each sync guard: a call taking the key, and its close."""
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )
    from idemkit import MethodConfig, idempotent_sync
    from idemkit.backends.redis import RedisBackend

    guards = own_sync_guards(url)
    client = redis.Redis.from_url(f"{url}/3")
    layer = RedisCachePersistenceLayer(client=client)
    config = IdempotencyConfig(event_key_jmespath="order_id")

    @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
    def powertools(order: dict[str, Any]) -> dict[str, Any]:
        return _order(order["order_id"], order["amount"])

    guards["powertools"] = (
        lambda key: powertools(order={"order_id": key, "amount": 5}),
        client.close,
    )

    backend = RedisBackend.from_url(f"{url}/4")
    idemkit = idempotent_sync(backend=backend, config=MethodConfig(key_fields=["order_id"]))(_order)
    guards["idemkit"] = (lambda key: idemkit(key, 5), lambda: None)
    return guards


def run_sync(name: str, call: Callable[[str], Any], row: str, seconds: float) -> Result:
    fixed = f"fixed-{uuid.uuid4().hex}"
    call(fixed)  # warm: connections, scripts loaded, the fixed key stored
    prefix = uuid.uuid4().hex[:12]
    server, calls, start, cpu = _server_cpu(), 0, time.perf_counter(), time.process_time()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            call(fixed if row == "replay" else f"{prefix}-{calls}")
            calls += 1
    elapsed, used = time.perf_counter() - start, time.process_time() - cpu
    return Result("sync", name, row, calls, elapsed, used, _server_used(server))


def _server_used(before: float) -> float | None:
    return None if SERVER_PID is None else _server_cpu() - before


# -- async guards -----------------------------------------------------------------------------


async def _order_async(order_id: str, amount: int) -> dict[str, Any]:
    return {"order": order_id, "charged": amount}


async def async_guards(
    url: str, peers: bool = True
) -> tuple[dict[str, Callable[[str], Any]], Callable[[], Any]]:
    """Each async guard (on this event loop): a call taking the key; and their close.
    Without ``peers``, only the bare function, ours and the floor."""
    from idempotence import ClaimRequest, Outcome, StoredResponse, idempotent
    from idempotence.stores.redis import AsyncRedisStore

    ours_store = AsyncRedisStore(f"{url}/5")
    ours = idempotent(ours_store, key="order_id", name="bench")(_order_async)
    hand_store = AsyncRedisStore(f"{url}/6")

    async def hand(key: str) -> Any:
        request = ClaimRequest(scope="bench", key=key, fingerprint=_fingerprint(key, 5))
        claim = await hand_store.claim(request)
        if claim.outcome is Outcome.REPLAY:
            assert claim.response is not None
            return json.loads(claim.response.body)
        assert claim.outcome is Outcome.EXECUTE
        assert claim.lease is not None
        value = await _order_async(key, 5)
        await hand_store.finish(claim.lease, StoredResponse(200, (), json.dumps(value).encode()))
        return value

    guards: dict[str, Callable[[str], Any]] = {
        "bare": lambda key: _order_async(key, 5),
        "ours": lambda key: ours(key, 5),
        "hand": hand,
    }
    if peers:
        from idemkit import MethodConfig
        from idemkit import idempotent as idemkit_idempotent
        from idemkit.backends.redis import RedisBackend

        backend = RedisBackend.from_url(f"{url}/7")
        idemkit = idemkit_idempotent(backend=backend, config=MethodConfig(key_fields=["order_id"]))(
            _order_async
        )
        guards["idemkit"] = lambda key: idemkit(key, 5)

    async def close() -> None:
        await ours_store.close()
        await hand_store.close()

    return guards, close


async def run_async(name: str, call: Callable[[str], Any], row: str, seconds: float) -> Result:
    fixed = f"fixed-{uuid.uuid4().hex}"
    await call(fixed)
    prefix = uuid.uuid4().hex[:12]
    server, calls, start, cpu = _server_cpu(), 0, time.perf_counter(), time.process_time()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            await call(fixed if row == "replay" else f"{prefix}-{calls}")
            calls += 1
    elapsed, used = time.perf_counter() - start, time.process_time() - cpu
    return Result("async", name, row, calls, elapsed, used, _server_used(server))


async def async_round(url: str, number: int, seconds: float, only: set[str]) -> list[Result]:
    guards, close = await async_guards(url)
    results = []
    for row in ROWS:
        for name in _order_of(guards, number, only):
            results.append(await run_async(name, guards[name], row, seconds))
    await close()
    return results


# -- instructions per call (--count) ---------------------------------------------------------


COUNTED = [
    f"{flavour}:{guard}:{row}"
    for flavour in ("sync", "async")
    for row in ROWS
    for guard in ("bare", "hand", "ours")
]
"""What --count counts: ours, the floor and the bare function (whose calls the two
others make too)."""


def child(spec: str, url: str, warmup: int, calls: int) -> None:
    """Make ``warmup`` then ``calls`` calls of one guard (``flavour:guard:row``): the
    process that --count runs under callgrind."""
    flavour, guard, row = spec.split(":")
    fixed, prefix = f"fixed-{uuid.uuid4().hex}", uuid.uuid4().hex[:12]
    keys = [fixed if row == "replay" else f"{prefix}-{n}" for n in range(warmup + calls)]
    if flavour == "sync":
        call = own_sync_guards(url)[guard][0]
        call(fixed)
        for key in keys:
            call(key)
        return

    async def run() -> None:
        guards, close = await async_guards(url, peers=False)
        call = guards[guard]
        await call(fixed)
        for key in keys:
            await call(key)
        await close()

    asyncio.run(run())


def instructions(spec: str, url: str, warmup: int, calls: int) -> int:
    """The instructions of a child process making ``calls`` calls, start-up included."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        command += ["--dump-instr=no", "--compress-strings=no", sys.executable, __file__]
        command += ["--child", spec, "--redis", url, "--warmup", str(warmup)]
        # A fixed hash seed: the same probing in every run, so rows compare across runs.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        subprocess.run([*command, "--calls", str(calls)], check=True, capture_output=True, env=env)
        with open(out) as f:
            found = re.search(r"^(?:summary|totals):\s+(\d+)", f.read(), re.MULTILINE)
    if found is None:
        raise RuntimeError("callgrind wrote no totals")
    return int(found.group(1))


def count(specs: list[str], url: str, warmup: int, calls: int) -> dict[str, float]:
    """Instructions per call of each spec: two runs, ``calls`` and 3 x ``calls`` calls
    after the same warm-up, so that the start-up cancels out."""
    counted = {}
    for spec in specs:
        small = instructions(spec, url, warmup, calls)
        large = instructions(spec, url, warmup, 3 * calls)
        counted[spec] = (large - small) / (2 * calls)
        print(f"{spec:22} {counted[spec]:10,.0f} instructions/call", file=sys.stderr)
    return counted


def count_summary(counted: dict[str, float]) -> list[str]:
    """Ours over the floor, each less the bare function's instructions."""
    lines = []
    for flavour in ("sync", "async"):
        for row in ROWS:
            found = [counted.get(f"{flavour}:{guard}:{row}") for guard in ("bare", "hand", "ours")]
            bare, hand, ours = found
            if hand is None or ours is None:
                continue
            bare = bare or 0.0
            added = (ours - bare) / (hand - bare) - 1
            lines.append(
                f"{flavour:5} {row:7} ours {ours - bare:9,.0f} vs floor {hand - bare:9,.0f} "
                f"instructions/call over the bare function: {100 * added:+4.0f} %"
            )
    return lines


# -- the run ----------------------------------------------------------------------------------


def _order_of(guards: dict[str, Any], number: int, only: set[str]) -> list[str]:
    """The guards measured in round ``number``: in order, or reversed in odd rounds."""
    names = [name for name in guards if not only or name in only]
    return names if number % 2 == 0 else names[::-1]


def medians(rounds: list[list[Result]]) -> list[dict[str, Any]]:
    """Each (flavour, guard, row): its calls/s and CPU per call, medians of the rounds."""
    by: dict[tuple[str, str, str], list[Result]] = {}
    for results in rounds:
        for result in results:
            by.setdefault((result.flavour, result.guard, result.row), []).append(result)
    table = []
    for (flavour, guard, row), results in by.items():
        rates = [r.rate for r in results]
        rate = statistics.median(rates)
        table.append(
            {
                "flavour": flavour,
                "guard": guard,
                "row": row,
                "calls": sum(r.calls for r in results),
                "rate": rate,
                "cpu_us": statistics.median(r.cpu_us for r in results),
                "server_us": _median_of([r.server_us for r in results]),
                "spread": (max(rates) - min(rates)) / rate,
                "rounds": [asdict(r) for r in results],
            }
        )
    return table


def _median_of(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def summary(rounds: list[list[Result]]) -> list[str]:
    """Ours against each other guard and the hand-written floor: calls/s as a ratio
    (ours / theirs), CPU per call as ours over theirs, medians of the same-round ratios."""
    ratios: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for results in rounds:
        by = {(r.flavour, r.guard, r.row): r for r in results}
        for (flavour, guard, row), ours in by.items():
            if guard != "ours":
                continue
            for other in ("hand", "powertools", "idemkit"):
                peer = by.get((flavour, other, row))
                if peer is not None:
                    pair = (ours.rate / peer.rate, ours.cpu_us / peer.cpu_us - 1)
                    ratios.setdefault((flavour, row, other), []).append(pair)
    lines = []
    for (flavour, row, other), pairs in sorted(ratios.items()):
        rate = statistics.median(p[0] for p in pairs)
        cpu = statistics.median(p[1] for p in pairs)
        lines.append(
            f"{flavour:5} {row:7} ours / {other:10} = {rate:5.2f}x calls/s, "
            f"CPU/call {100 * cpu:+4.0f} %"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s per row")
    parser.add_argument("--seconds", type=float, default=2.0, help="per row per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--redis", default=None, help="a Redis URL (default: a throwaway one)")
    parser.add_argument("--guard", action="append", default=[], help="only these guards")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--count",
        nargs="*",
        metavar="FLAVOUR:GUARD:ROW",
        help=f"instructions per call under callgrind instead (default: {' '.join(COUNTED)})",
    )
    parser.add_argument("--calls", type=int, default=300, help="--count: N (runs N and 3N)")
    parser.add_argument("--warmup", type=int, default=200, help="--count: calls first")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.redis, args.warmup, args.calls)
    if args.quick:
        args.seconds, args.rounds = 1.0, 1
    only = set(args.guard)
    rounds: list[list[Result]] = []
    global SERVER_PID
    with harness.contextlib.ExitStack() as stack:
        if args.redis:
            url = args.redis
        else:
            url, SERVER_PID = stack.enter_context(harness.throwaway_redis())
        if args.count is not None:
            counted = count(args.count or COUNTED, url, args.warmup, args.calls)
            print(json.dumps(counted) if args.json else "\n".join(count_summary(counted)))
            return
        guards = sync_guards(url)
        for number in range(args.rounds):
            results = [
                run_sync(name, guards[name][0], row, args.seconds)
                for row in ROWS
                for name in _order_of(guards, number, only)
            ]
            results += asyncio.run(async_round(url, number, args.seconds, only))
            rounds.append(results)
        for _, close in guards.values():
            close()
    table = medians(rounds)
    if args.json:
        print(json.dumps(table))
        return
    print(
        f"{args.rounds} interleaved rounds of {args.seconds:g} s per row (medians); "
        f"{os.cpu_count()} CPU cores; load average {os.getloadavg()[0]:.2f} at the end"
    )
    print(
        f"{'flavour':7} {'guard':10} {'row':8} {'calls/s':>9} {'CPU/call':>10} "
        f"{'redis CPU/call':>14} {'spread':>7}"
    )
    for r in table:
        server = "-" if r["server_us"] is None else f"{r['server_us']:.1f}us"
        print(
            f"{r['flavour']:7} {r['guard']:10} {r['row']:8} {r['rate']:9.0f} "
            f"{r['cpu_us']:8.1f}us {server:>14} {100 * r['spread']:6.0f}%"
        )
    print()
    print("\n".join(summary(rounds)))


if __name__ == "__main__":
    sys.exit(main())
