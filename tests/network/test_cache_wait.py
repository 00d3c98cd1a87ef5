"""An eviction's tombstone in the cached store's Redis waits for a replica (issue 35,
DESIGN 8 and 13): ``replicas=N`` on the cache.

Evicting a key stores a tombstone in the cache first, then deletes the row, so no
cached response outlives its key. A tombstone only the master held is lost with it:
the promoted replica still holds the evicted row's entry and replays it, to a request
the primary would run afresh (or, once the key ran again, beside a different stored
answer). A master and a replica of the test's own; the replica is cut off (detached:
it keeps what it had, and gets nothing more) before the second eviction, and the
master is then killed and the replica serves as the cache. With ``replicas=1`` the
eviction the replica could not confirm evicts nothing (StoreUnavailable), so after
the failover every claim agrees with the primary: the evicted key runs again, the kept
key replays its one answer. Without the wait, the kept key's eviction succeeds on the
master alone and the promoted cache replays the evicted key.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from idempotence import SqliteStore
from idempotence.errors import ConfigurationError, StoreUnavailable
from idempotence.maintenance.admin import evict_key
from idempotence.states import ClaimRequest, Outcome, StoredResponse
from idempotence.stores.cached import CachedStore
from tests.support.redis import RedisServer, caught_up, replicated

SCOPE = "s"


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    with replicated() as servers:
        yield servers


def request(key: str) -> ClaimRequest:
    return ClaimRequest(
        scope=SCOPE, key=key, fingerprint="f" * 64, lock_timeout=timedelta(seconds=5)
    )


def finished(store: CachedStore, key: str) -> None:
    claim = store.claim(request(key))
    assert claim.outcome is Outcome.EXECUTE and claim.lease is not None
    store.finish(claim.lease, StoredResponse.of(201, body=key.encode()))
    assert store.claim(request(key)).outcome is Outcome.REPLAY  # its entry is cached


def test_an_eviction_no_replica_confirmed_evicts_nothing_and_no_failover_replays_it(
    pair: tuple[RedisServer, RedisServer], tmp_path: Path
) -> None:
    master, replica = pair
    path = str(tmp_path / "primary.sqlite3")
    prefix = f"idemtest-{uuid.uuid4().hex[:8]}"
    with SqliteStore(path) as primary:
        primary.migrate()
    url = f"{master.url}?replicas=1&replica_timeout=0.1"  # the cache's timeout is 0.25 s
    with CachedStore(SqliteStore(path), url, prefix=prefix) as store:
        finished(store, "evicted")
        finished(store, "kept")
        caught_up(master, replica)
        evict_key(store, SCOPE, "evicted")  # the replica confirmed its tombstone
        with redis.Redis(port=replica.port) as copy:
            copy.replicaof("NO", "ONE")  # cut off: it has everything so far, and no more
        refused: StoreUnavailable | None = None
        try:
            evict_key(store, SCOPE, "kept")
        except StoreUnavailable as exc:
            refused = exc
    master.stop()  # the failover: the replica is the cache now
    with (
        CachedStore(SqliteStore(path), replica.url, prefix=prefix) as after,
        SqliteStore(path) as truth,
    ):
        for key in ("evicted", "kept"):
            present = truth.get(SCOPE, key) is not None
            claim = after.claim(request(key))
            if not present:
                # Evicted: the key runs afresh; a replay here is the evicted answer.
                assert claim.outcome is Outcome.EXECUTE, (key, claim.outcome)
            else:
                assert claim.outcome is Outcome.REPLAY, (key, claim.outcome)
                assert claim.record.response is not None
                assert claim.record.response.body == key.encode()
        assert after.cache_stats.hits == 1  # the kept key, from the promoted cache
    assert refused is not None, "evicted with a tombstone only the master had"
    assert "reached 0 of the 1 replica(s)" in str(refused)
    assert "nothing was evicted" in str(refused)


def test_a_replica_timeout_the_cache_would_cut_short_is_refused(tmp_path: Path) -> None:
    """The cache's timeout (0.25 s) bounds its calls: a WAIT longer than it would be
    cut off before its count arrives, so the option is refused when the store opens."""
    url = "redis://127.0.0.1:6379/0?replicas=1&replica_timeout=0.5"
    with pytest.raises(ConfigurationError, match="must be shorter than the store's timeout"):
        CachedStore(SqliteStore(str(tmp_path / "primary.sqlite3")), url)
    with pytest.raises(ConfigurationError, match="given both in the Redis URL and"):
        CachedStore(SqliteStore(str(tmp_path / "primary.sqlite3")), url, replicas=1)
