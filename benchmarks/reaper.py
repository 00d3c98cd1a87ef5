"""The reaper's deletion rate, and what reaping costs the requests that run meanwhile.

Run it from the repository root::

    .venv/bin/python benchmarks/reaper.py              # 2,000,000 keys, a few minutes
    .venv/bin/python benchmarks/reaper.py --quick      # 200,000 keys, about a minute
    .venv/bin/python benchmarks/reaper.py --keys 500000 --threads 8 --json

PostgreSQL only (the reaper's production home): ``--postgres URL`` (default:
``$IDEMPOTENCE_TEST_POSTGRES``, else ``postgresql://postgres@127.0.0.1:5432/postgres``).
The script creates ``idempotence_bench_reaper_<pid>``, fills it and drops it at the end.

What it does, in one run:

1. Inserts ``--keys`` finished keys with ``generate_series`` (a thousand scopes), half
   of them past ``expires_at`` and half not, then ``VACUUM ANALYZE``.
2. **Baseline**: ``--threads`` workers claim new keys and finish them (the claim is
   what a request pays first) for ``--seconds``; the claim latency is recorded.
3. **During reaping**: the same load runs while one reaper pass (default settings:
   batches of ``--batch-size``, jittered ``--batch-pause``) deletes every expired key.
   The claim latency is recorded for exactly the reaping window; the reaper's rate is
   deleted keys per second of its pass.
4. **Baseline again**, on the reaped table, for ``--seconds``.

It prints a table of claim latency (p50, p99, max) per phase, the reaper's rate, and
the ratio of the claim p99 during reaping to the first baseline's; the target is
``<= 2``. The script measures; it does not judge (only an error makes it fail).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from idempotence import ClaimRequest, StoredResponse
from idempotence.maintenance import Reaper, ReaperConfig
from idempotence.stores.postgres import PostgresStore

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
CHUNK = 250_000

FILL = """
INSERT INTO idempotency_keys (
    scope, key, request_method, request_path, fingerprint, request_params, flow,
    recovery_point, lock_timeout, response_status, response_headers, response_body,
    created_at, last_run_at, finished_at, expires_at
)
SELECT 'scope-' || (g %% 1000), 'key-' || g, 'POST', '/rides', md5(g::text), '{}', 'rides',
    'finished', interval '60 seconds', 201, '[]', '\\x7b7d'::bytea,
    now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
    CASE WHEN g %% 2 = 0 THEN now() - interval '1 hour' ELSE now() + interval '1 day' END
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""


@dataclass
class Phase:
    name: str
    claims: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def rate(self) -> float:
        return self.claims / self.seconds if self.seconds else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


class Load:
    """``threads`` workers claiming and finishing new keys until stopped; each claim's
    latency is kept with its start time, so a window can be cut out afterwards."""

    def __init__(self, store: PostgresStore, threads: int) -> None:
        self.store = store
        self.threads = threads
        self.samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def start(self) -> None:
        self._stop.clear()
        self._workers = [
            threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(self.threads)
        ]
        for worker in self._workers:
            worker.start()

    def stop(self) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join()

    def _work(self, n: int) -> None:
        prefix = uuid.uuid4().hex[:8]
        response = StoredResponse.of(201, {"content-type": "application/json"}, b"{}")
        i = 0
        while not self._stop.is_set():
            i += 1
            request = ClaimRequest(
                scope=f"load-{n % 1000}", key=f"{prefix}-{n}-{i}", fingerprint="f" * 64
            )
            started = time.perf_counter()
            claim = self.store.claim(request)
            took = time.perf_counter() - started
            assert claim.lease is not None
            self.store.finish(claim.lease, response)
            with self._lock:
                self.samples.append((started, took))

    def window(self, name: str, start: float, end: float) -> Phase:
        with self._lock:
            took = [t * 1000 for s, t in self.samples if start <= s < end]
        return Phase(
            name,
            len(took),
            end - start,
            statistics.median(took) if took else 0.0,
            percentile(took, 0.99),
            max(took, default=0.0),
        )


def measure(load: Load, name: str, seconds: float) -> Phase:
    start = time.perf_counter()
    time.sleep(seconds)
    return load.window(name, start, time.perf_counter())


def fill(url: str, keys: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, keys + 1, CHUNK):
            last = min(first + CHUNK - 1, keys)
            conn.execute(FILL, {"first": first, "last": last})
            print(f"  inserted {last:,} / {keys:,} keys", file=sys.stderr)
        conn.execute("VACUUM ANALYZE idempotency_keys")
        # Flush the fill's WAL now, so that its checkpoint does not land in (and slow
        # down) the first baseline.
        conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=os.environ.get("IDEMPOTENCE_TEST_POSTGRES"))
    parser.add_argument("--keys", type=int, default=None, help="finished keys (half expired)")
    parser.add_argument("--quick", action="store_true", help="200,000 keys, short phases")
    parser.add_argument("--threads", type=int, default=4, help="claiming workers")
    parser.add_argument("--seconds", type=float, default=None, help="each baseline phase")
    parser.add_argument("--batch-size", type=int, default=ReaperConfig().batch_size)
    parser.add_argument("--batch-pause", type=float, default=ReaperConfig().batch_pause)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    keys = args.keys or (200_000 if args.quick else 2_000_000)
    seconds = args.seconds or (5.0 if args.quick else 15.0)
    server = args.postgres or DEFAULT_POSTGRES
    if server in ("auto", "throwaway", "embedded"):
        server = DEFAULT_POSTGRES

    name = f"idempotence_bench_reaper_{os.getpid()}"
    url = make_conninfo(server, dbname=name)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        store = PostgresStore(url, max_size=args.threads + 2)
        store.migrate()
        print(f"filling {keys:,} finished keys (half expired)...", file=sys.stderr)
        fill_seconds = fill(url, keys)
        load = Load(store, args.threads)
        load.start()
        time.sleep(1.0)  # warm the pool and the caches
        before = measure(load, "baseline", seconds)

        reaper = Reaper(
            store, ReaperConfig(batch_size=args.batch_size, batch_pause=args.batch_pause)
        )
        start = time.perf_counter()
        result = reaper.run_once()
        end = time.perf_counter()
        during = load.window("during reaping", start, end)
        after = measure(load, "baseline after", seconds)
        load.stop()
        store.close()
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    rate = result.deleted / result.seconds if result.seconds else 0.0
    ratio = during.p99_ms / before.p99_ms if before.p99_ms else float("inf")
    ratio_after = during.p99_ms / after.p99_ms if after.p99_ms else float("inf")
    phases = [before, during, after]
    if args.json:
        print(
            json.dumps(
                {
                    "keys": keys,
                    "threads": args.threads,
                    "fill_seconds": fill_seconds,
                    "phases": [asdict(p) | {"claims_per_second": p.rate} for p in phases],
                    "reaper": {
                        "deleted": result.deleted,
                        "seconds": result.seconds,
                        "batches": result.batches,
                        "keys_per_second": rate,
                        "batch_size": args.batch_size,
                        "batch_pause": args.batch_pause,
                    },
                    "p99_ratio": ratio,
                    "p99_ratio_to_baseline_after": ratio_after,
                },
                indent=2,
            )
        )
        return
    server_name = conninfo_to_dict(server).get("host", "?")
    print(
        f"\nreaper benchmark: {keys:,} finished keys (half expired) on PostgreSQL at "
        f"{server_name}; {args.threads} claiming threads; filled in {fill_seconds:.1f}s\n"
    )
    print(f"{'phase':<16}{'claims':>9}{'claims/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for p in phases:
        print(
            f"{p.name:<16}{p.claims:>9,}{p.rate:>10,.0f}{p.p50_ms:>9.2f}"
            f"{p.p99_ms:>9.2f}{p.max_ms:>9.1f}"
        )
    print(
        f"\nreaper: deleted {result.deleted:,} keys in {result.seconds:.1f}s = "
        f"{rate:,.0f} keys/s ({result.batches} batches of {args.batch_size}, "
        f"pause {args.batch_pause}s)"
    )
    verdict = "within" if ratio <= 2 else "OVER"
    print(f"claim p99 during reaping / baseline = {ratio:.2f} ({verdict} the target of 2.0)")
    print(
        f"claim p99 during reaping / baseline after = {ratio_after:.2f} (the reaped table: "
        "smaller, and vacuumed by then)"
    )


if __name__ == "__main__":
    main()
