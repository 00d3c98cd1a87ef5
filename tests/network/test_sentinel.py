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

import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from idempotence.errors import ConfigurationError, StoreUnavailable
from idempotence.states import ClaimRequest, Outcome, StoredResponse
from idempotence.stores._redis_url import sentinel_url
from idempotence.stores.redis import RedisStore
from tests.support.redis import RedisServer, free_port

SERVICE = "idemsvc"


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
def sentinel_setup() -> Iterator[tuple[RedisServer, RedisServer, int]]:
    master = RedisServer().start()
    replica = RedisServer(None, "--replicaof", "127.0.0.1", str(master.port)).start()
    directory = Path(tempfile.mkdtemp(prefix="idemtest-sentinel-"))
    port = free_port()
    config = directory / "sentinel.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 5000\n"
    )
    binary = shutil.which("redis-server")
    assert binary is not None, "the tests need redis-server on PATH"
    sentinel = subprocess.Popen(
        [binary, str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 15
        while True:  # the sentinel knows the master and its replica
            try:
                with redis.Redis(port=port, socket_timeout=1) as client:
                    if client.sentinel_slaves(SERVICE):
                        break
            except redis.RedisError:
                pass
            assert time.monotonic() < deadline, "the sentinel never saw the replica"
            time.sleep(0.1)
        yield master, replica, port
    finally:
        sentinel.kill()
        sentinel.wait(timeout=10)
        replica.close()
        master.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_the_store_follows_a_failover_through_the_sentinel(
    sentinel_setup: tuple[RedisServer, RedisServer, int],
) -> None:
    master, replica, port = sentinel_setup
    prefix = f"idemtest{uuid.uuid4().hex[:8]}"
    url = f"redis+sentinel://127.0.0.1:{port}/{SERVICE}/0"

    def request(key: str) -> ClaimRequest:
        return ClaimRequest(
            scope="s", key=key, fingerprint="f" * 64, lock_timeout=timedelta(seconds=2)
        )

    with RedisStore(url, prefix=prefix, timeout=0.5) as store:
        claim = store.claim(request("before"))
        assert claim.outcome is Outcome.EXECUTE and claim.lease is not None
        store.finish(claim.lease, StoredResponse.of(201, body=b"before"))
        # Let the replica catch up (asynchronous replication: without it the key
        # could be lost with the master, which is what the docs say). WAIT would only
        # wait for this client's own writes, so compare the replication offsets.
        with redis.Redis(port=master.port) as primary, redis.Redis(port=replica.port) as copy:
            deadline = time.monotonic() + 10
            while (
                copy.info("replication").get("slave_repl_offset")
                != primary.info("replication")["master_repl_offset"]
            ):
                assert time.monotonic() < deadline, "the replica never caught up"
                time.sleep(0.02)
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
