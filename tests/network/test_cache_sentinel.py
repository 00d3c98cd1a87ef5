"""The cached store's cache behind Redis Sentinel (issue 35 item 5, DESIGN 8 and 13).

A PostgreSQL primary, and a cache on ``redis+sentinel://``: a master, a replica and a
sentinel of the test's own. Clients run keys (first sends execute, repeats replay,
mostly from the cache) while the cache's master is killed and the sentinel promotes
the replica. The primary decides throughout: no request fails (a dead cache only
sends the replays to the primary), the history checker finds no duplicate effect and
no answer that changed, and once the replica is promoted the cache serves hits again.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest

from idempotence.stores.cached import CachedStore
from idempotence.stores.postgres import PostgresStore
from idempotence.testing import History
from tests.support.redis import SentinelGroup, sentinel_group

from .guarded import Provider, request, run_key

KEYS = 60
LOCK = timedelta(seconds=2)


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    with sentinel_group() as servers:
        yield servers


def test_the_cache_follows_a_failover_and_the_primary_decides(
    group: SentinelGroup, fresh_pg_url: str
) -> None:
    history = History()
    provider = Provider(history)
    scope = f"cache-{uuid.uuid4().hex[:8]}"
    store = CachedStore(
        PostgresStore(fresh_pg_url), group.url, prefix=f"idemtest-{scope}", pause=0.2
    )
    assert store._lane is None  # a Sentinel's master is found again at each connection
    stop = threading.Event()
    hits: list[tuple[float, int]] = []  # (when, the store's hits so far)
    rng = random.Random(35)

    def client() -> None:
        for n in itertools.count():
            if stop.is_set():
                return
            key = f"k{rng.randrange(KEYS)}" if n >= KEYS // 4 else f"k{n}"
            with history.operation(key) as op:
                op.answer(*run_key(store, provider, request(scope, key, LOCK)))
            hits.append((time.monotonic(), store.cache_stats.hits))
            time.sleep(0.005)

    threads = [threading.Thread(target=client) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        hits_before = store.cache_stats.hits
        group.master.stop()  # SIGKILL: the cache's master is gone
        killed = time.monotonic()
        promoted = group.wait_promoted()
        deadline = time.monotonic() + 15
        while not any(at > killed + promoted and n > hits_before for at, n in list(hits)):
            assert time.monotonic() < deadline, "the cache never served a hit again"
            time.sleep(0.05)
        time.sleep(1.0)  # and goes on serving
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    back = min(at for at, n in hits if at > killed + promoted and n > hits_before) - killed
    with PostgresStore(fresh_pg_url) as primary:
        records = {f"k{n}": primary.get(scope, f"k{n}") for n in range(KEYS)}
    report = history.check(records=records)
    # 409: two clients drew a key still running (the race, not the fault).
    failed = [op for op in history.operations if op.status not in (201, 409)]
    stats = store.cache_stats
    store.close()
    print(
        f"cache failover: promoted {promoted:.1f} s after the kill, hits again {back:.1f} s "
        f"after it; {report}; {stats}"
    )
    report.assert_ok()
    assert not failed, f"{len(failed)} requests failed while the cache failed over"
    assert stats.hits > hits_before and stats.errors > 0  # it did fail over, and served
