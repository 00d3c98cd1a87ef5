"""Redis with Sentinel (issue 35 item 5, DESIGN 13): ``redis+sentinel://`` URLs, and the
master killed under a store that keeps working on the promoted replica.

A master, a replica and one sentinel (quorum 1), each a redis-server of the test's own.
The master is killed (SIGKILL); the sentinel promotes the replica within a few
seconds; the store, which asks the sentinel for the master at each new connection,
answers 503 meanwhile and then works on the new master. Redis replicates
asynchronously: what the master finished in its last moments may be lost (the
replica's state is what survives), so a key finished before the kill is checked only
to be finished or absent, never half-done.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis

from idempotence.errors import ConfigurationError, StoreUnavailable
from idempotence.states import ClaimRequest, Outcome, StoredResponse
from idempotence.stores._redis_url import sentinel_url
from idempotence.stores.redis import RedisStore
from tests.support.redis import SentinelGroup, caught_up, sentinel_group


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "redis+sentinel://h1:26379,h2:26380/svc",
            ((("h1", 26379), ("h2", 26380)), "svc", 0, False),
        ),
        ("rediss+sentinel://u:p%40ss@h1/svc/3", ((("h1", 26379),), "svc", 3, True)),
    ],
)
def test_a_sentinel_url_is_read(url: str, expected: tuple[object, ...]) -> None:
    target = sentinel_url(url)
    assert target is not None
    assert (target.sentinels, target.service, target.db, target.tls) == expected
    assert sentinel_url("redis://h1:6379/0") is None


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://h1:26379", "no service name"),
        ("redis+sentinel://h1:port/svc", "invalid sentinel address"),
        ("redis+sentinel://h1:26379/svc/two", "invalid database"),
    ],
)
def test_a_bad_sentinel_url_says_what_to_write(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RedisStore(url)


@pytest.fixture
def sentinel_setup() -> Iterator[SentinelGroup]:
    with sentinel_group() as group:
        yield group


def test_the_store_follows_a_failover_through_the_sentinel(sentinel_setup: SentinelGroup) -> None:
    master, replica = sentinel_setup.master, sentinel_setup.replica
    prefix = f"idemtest{uuid.uuid4().hex[:8]}"
    url = sentinel_setup.url

    def request(key: str) -> ClaimRequest:
        return ClaimRequest(
            scope="s", key=key, fingerprint="f" * 64, lock_timeout=timedelta(seconds=2)
        )

    with RedisStore(url, prefix=prefix, timeout=0.5) as store:
        claim = store.claim(request("before"))
        assert claim.outcome is Outcome.EXECUTE and claim.lease is not None
        store.finish(claim.lease, StoredResponse.of(201, body=b"before"))
        # Let the replica catch up (asynchronous replication: without it the key
        # could be lost with the master, which is what the docs say; replicas=1 is
        # the store's way to wait for it, tested in test_redis_wait.py).
        caught_up(master, replica)
        master.stop()  # SIGKILL: the master's host is gone
        killed = time.monotonic()
        answered_503 = 0
        while True:
            try:
                claim = store.claim(request("after"))
                break
            except StoreUnavailable:
                answered_503 += 1
            assert time.monotonic() - killed < 30, "no master within 30 s of the kill"
            time.sleep(0.2)
        back = time.monotonic() - killed
        assert claim.outcome is Outcome.EXECUTE
        replay = store.claim(request("before"))
        assert replay.outcome is Outcome.REPLAY and replay.record.response is not None
        assert replay.record.response.body == b"before"
    print(f"sentinel failover: service back {back:.1f} s after the kill ({answered_503} x 503)")
    with redis.Redis(port=replica.port) as client:
        assert client.info("replication")["role"] == "master"
