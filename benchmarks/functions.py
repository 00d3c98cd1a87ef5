"""A guarded function's cost, side by side in one run: ``@idempotent`` against the bare
function, the same claim and finish written by hand (the floor), aws-lambda-powertools'
``idempotent_function`` (its Redis persistence layer) and idemkit's decorator, all on
one throwaway redis-server (a database number each).

Run it from the repository root::

    .venv/bin/python benchmarks/functions.py            # 3 s a row, about a minute
    .venv/bin/python benchmarks/functions.py --quick    # 1 s a row
    .venv/bin/python benchmarks/functions.py --json

The peers are never the package's dependencies: benchmarks/requirements.txt is
installed into benchmarks/.deps (see _harness.py) and put last on ``sys.path``.

Rows: ``execute`` (a new key every call: claim, run, store) and ``replay`` (one key
throughout: the stored result). Each guard is called in a loop by one caller for the
row's duration; ``calls/s`` is the calls it completed, ``CPU/call`` the process's CPU
time (every thread: powertools and idemkit's sync decorator run work on threads) per
call. Sync guards: ours (``RedisStore``), hand (the same ``RedisStore`` claim and
finish written out), powertools (sync only), idemkit (``idempotent_sync``, which runs
its engine on a loop thread). Async guards: ours (``AsyncRedisStore``), hand, idemkit
(``idempotent``). The function returns a small dict.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import _harness as harness

harness.use_repo()
harness.use_deps()

os.environ.setdefault("POWERTOOLS_IDEMPOTENCY_DISABLED", "false")


@dataclass
class Result:
    flavour: str
    guard: str
    row: str
    calls: int
    seconds: float
    cpu: float

    @property
    def rate(self) -> float:
        return self.calls / self.seconds

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.calls * 1e6


def _order(order_id: str, amount: int) -> dict[str, Any]:
    return {"order": order_id, "charged": amount}


def _fingerprint(order_id: str, amount: int) -> str:
    body = json.dumps({"amount": amount, "order_id": order_id}, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


# -- sync guards ------------------------------------------------------------------------------


def sync_guards(url: str) -> dict[str, tuple[Callable[[str], Any], Callable[[], None]]]:
    """Each sync guard: a call taking the key, and its close."""
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )
    from idemkit import MethodConfig, idempotent_sync
    from idemkit.backends.redis import RedisBackend

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
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            call(fixed if row == "replay" else f"{prefix}-{calls}")
            calls += 1
    return Result("sync", name, row, calls, time.perf_counter() - start, time.process_time() - cpu)


# -- async guards -----------------------------------------------------------------------------


async def _order_async(order_id: str, amount: int) -> dict[str, Any]:
    return {"order": order_id, "charged": amount}


async def run_async(url: str, rows: list[str], seconds: float, only: set[str]) -> list[Result]:
    from idemkit import MethodConfig
    from idemkit import idempotent as idemkit_idempotent
    from idemkit.backends.redis import RedisBackend

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

    backend = RedisBackend.from_url(f"{url}/7")
    idemkit = idemkit_idempotent(backend=backend, config=MethodConfig(key_fields=["order_id"]))(
        _order_async
    )
    guards: dict[str, Callable[[str], Any]] = {
        "bare": lambda key: _order_async(key, 5),
        "ours": lambda key: ours(key, 5),
        "hand": hand,
        "idemkit": lambda key: idemkit(key, 5),
    }
    results = []
    for row in rows:
        for name, call in guards.items():
            if only and name not in only:
                continue
            fixed = f"fixed-{uuid.uuid4().hex}"
            await call(fixed)
            prefix = uuid.uuid4().hex[:12]
            calls, start, cpu = 0, time.perf_counter(), time.process_time()
            deadline = start + seconds
            while time.perf_counter() < deadline:
                for _ in range(50):
                    await call(fixed if row == "replay" else f"{prefix}-{calls}")
                    calls += 1
            elapsed, used = time.perf_counter() - start, time.process_time() - cpu
            results.append(Result("async", name, row, calls, elapsed, used))
    await ours_store.close()
    await hand_store.close()
    return results


# -- the run ----------------------------------------------------------------------------------


def summary(results: list[Result]) -> list[str]:
    """Our calls/s as a ratio of each peer's and of the hand-written floor."""
    by = {(r.flavour, r.guard, r.row): r for r in results}
    lines = []
    for (flavour, guard, row), result in sorted(by.items()):
        if guard != "ours":
            continue
        for other in ("hand", "powertools", "idemkit"):
            peer = by.get((flavour, other, row))
            if peer is not None:
                ratio = result.rate / peer.rate
                lines.append(f"{flavour:5} {row:7} ours / {other:10} = {ratio:5.2f}x calls/s")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s per row")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--redis", default=None, help="a Redis URL (default: a throwaway one)")
    parser.add_argument("--guard", action="append", default=[], help="only these guards")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    rows = ["execute", "replay"]
    only = set(args.guard)
    with harness.contextlib.ExitStack() as stack:
        url = args.redis or stack.enter_context(harness.throwaway_redis())[0]
        results: list[Result] = []
        guards = sync_guards(url)
        for row in rows:
            for name, (call, _) in guards.items():
                if not only or name in only:
                    results.append(run_sync(name, call, row, seconds))
        for _, close in guards.values():
            close()
        results += asyncio.run(run_async(url, rows, seconds, only))
    if args.json:
        print(json.dumps([asdict(r) | {"rate": r.rate, "cpu_us": r.cpu_us} for r in results]))
        return
    print(f"{'flavour':7} {'guard':10} {'row':8} {'calls/s':>9} {'CPU/call':>10}")
    for r in results:
        print(f"{r.flavour:7} {r.guard:10} {r.row:8} {r.rate:9.0f} {r.cpu_us:8.1f}us")
    print()
    print("\n".join(summary(results)))


if __name__ == "__main__":
    sys.exit(main())
