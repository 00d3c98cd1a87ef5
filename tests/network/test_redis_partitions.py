"""Partitions on the link to Redis (DESIGN 13; issue 35 item 3).

The same boundaries as tests/network/test_partitions.py, for the Redis store (handler
mode: a key store): the app server in its namespace reaches Redis through a relay on
the back link, which adds latency so that the test can cut the link while the claim,
the handler or the finish is in flight. The history checker judges each run as there.
The Redis store's bound is its ``timeout=`` (1 s here): a command the partition cut off
fails within it, and the request is answered 503.

And the cached store's cache link: PostgreSQL is the primary (over the back link), its
Redis cache sits on a third link of its own. Cutting the cache link must not break
anything: every request is answered by the primary alone, 201 or the replay, within
the cache's small timeout of what it takes without a cache, and the history checker
finds every promise kept through the cut and after it.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from idempotence.testing import History

from .hosts import AppHost
from .test_partitions import (
    FAIL_WITHIN,
    LOCK,
    LONG_LOCK,
    Served,
    attempt,
    keeps_every_promise,
    never_acknowledges_unstored,
    serve,
)

#: A request while the cache link is down: the cache's timeout (0.25 s) for each of
#: the few Redis calls a request makes before the cache pauses, on top of what the
#: primary takes; slack for a machine shared by many test runs.
CACHE_CUT_WITHIN = 2.0


@pytest.fixture
def redis_served(app_host: AppHost, redis_url: str, redis_prefix: str, tmp_path: Path) -> Served:
    return serve(app_host, None, tmp_path, LOCK, kind="redis", redis=(redis_url, redis_prefix))


@pytest.mark.parametrize(
    "boundary",
    [
        pytest.param("claim", id="handler-claim"),
        pytest.param("handler", id="handler-during", marks=pytest.mark.slow),
        pytest.param("finish", id="handler-finish", marks=pytest.mark.slow),
    ],
)
def test_a_partition_on_the_redis_link_at_each_boundary_keeps_every_promise(
    redis_served: Served, boundary: str
) -> None:
    keeps_every_promise(redis_served, "/charges", boundary)


@pytest.mark.parametrize(
    "landed",
    [
        pytest.param(False, id="finish-cut"),
        pytest.param(True, id="finish-reply-lost", marks=pytest.mark.slow),
    ],
)
def test_redis_handler_mode_never_acknowledges_an_answer_it_could_not_store(
    app_host: AppHost, redis_url: str, redis_prefix: str, tmp_path: Path, landed: bool
) -> None:
    served = serve(
        app_host, None, tmp_path, LONG_LOCK, kind="redis", redis=(redis_url, redis_prefix)
    )
    never_acknowledges_unstored(served, landed)


PATHS = ("/charges", "/transfers", "/rides")


def test_a_partition_of_the_cache_link_falls_back_to_the_primary(
    cache_host: AppHost, fresh_pg_url: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    served = serve(
        cache_host, fresh_pg_url, tmp_path, LOCK, kind="cached", redis=(redis_url, redis_prefix)
    )
    assert cache_host.cache is not None
    history, keys = History(), []
    slowest = 0.0

    def send(key: str, path: str) -> int | None:
        nonlocal slowest
        started = time.monotonic()
        status = attempt(history, client, path, key)
        slowest = max(slowest, time.monotonic() - started)
        return status

    with httpx.Client(base_url=served.url, timeout=FAIL_WITHIN + 5) as client:
        # Before the cut: each key answered, then replayed (which caches it).
        before = [(f"cache-before-{n}", PATHS[n % 3]) for n in range(6)]
        for key, path in before:
            keys.append(key)
            assert attempt(history, client, path, key) == 201
            assert attempt(history, client, path, key) == 201
        with cache_host.cache.partitioned():
            cut = time.monotonic()
            n = 0
            while time.monotonic() - cut < 3.0:  # past the cache's pause, twice over
                key, path = f"cache-during-{n}", PATHS[n % 3]
                keys.append(key)
                assert send(key, path) == 201, "a new key failed while the cache was cut"
                assert send(key, path) == 201, "a replay failed while the cache was cut"
                before_key, before_path = before[n % len(before)]
                assert send(before_key, before_path) == 201, "a cached key failed"
                n += 1
            during = slowest
        healed_at = history.now()
        for n in range(6):  # after the heal: the cache comes back, nothing is stale
            key, path = f"cache-after-{n}", PATHS[n % 3]
            keys.append(key)
            assert attempt(history, client, path, key) == 201
        for key, path in before:
            assert attempt(history, client, path, key) == 201
    print(f"slowest request while the cache link was cut: {during:.2f} s")
    assert during <= CACHE_CUT_WITHIN, f"a request took {during:.2f} s with the cache cut off"
    served.check(history, keys, healed_at).assert_ok()
