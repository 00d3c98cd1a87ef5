"""What a first request costs on CachedStore (DESIGN 8: Cached; DESIGN 11): its finish
is the primary's plain finish, batched as the primary's are, returning two times and
not the whole row; the entry it writes to Redis is built from the claim's record, and
is still exactly the row the primary holds (a replay from Redis is the primary's
answer, P3). On real PostgreSQL, SQLite and Redis.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest

from idempotence import Outcome, StoredResponse
from idempotence.stores.cached import AsyncCachedStore
from idempotence.stores.postgres import AsyncPostgresStore
from tests.support.roundtrips import round_trips
from tests.test_store_batching import WARM_UP
from tests.test_store_cached import KINDS, Cached, cached, request, response

__all__ = ["cached"]  # the fixture, shared with test_store_cached


@pytest.mark.parametrize("cached", KINDS, indirect=True)
@pytest.mark.parametrize(
    ("error", "retention"),
    [(None, timedelta(days=1)), ("boom", timedelta(hours=2)), (None, None)],
)
def test_p3_the_entry_a_finish_writes_is_the_primarys_row(
    cached: Cached, scope: str, error: str | None, retention: timedelta | None
) -> None:
    claim = cached.face.claim(request(scope, retention=retention))
    assert claim.outcome is Outcome.EXECUTE and claim.lease is not None
    cached.face.finish(claim.lease, response(1), error=error)
    assert cached.store._cache._claims == {}  # kept only until the finish
    truth = cached.primary.claim(request(scope, retention=retention))
    assert truth.outcome is Outcome.REPLAY
    if retention is None:
        # Kept forever: the entry lives its ttl, and the record says forever.
        assert truth.record.expires_at is None
    entry = cached.redis.get(cached.name(scope))
    assert entry is not None
    assert cached.store._cache.entry_record(entry) == truth.record  # every field
    hits = cached.store.cache_stats.hits
    assert cached.face.claim(request(scope, retention=retention)) == truth
    assert cached.store.cache_stats.hits == hits + 1


@pytest.mark.parametrize("cached", KINDS, indirect=True)
def test_a_finish_of_a_claim_made_elsewhere_is_cached_by_its_first_replay(
    cached: Cached, scope: str
) -> None:
    claim = cached.primary.claim(request(scope))  # not through the cached store
    cached.face.finish(claim.lease, response(2))
    assert cached.redis.get(cached.name(scope)) is None
    truth = cached.face.claim(request(scope))  # the primary's replay, now cached
    assert truth.outcome is Outcome.REPLAY and truth.record.error is None
    assert cached.face.claim(request(scope)) == truth
    assert cached.store.cache_stats.hits == 1


@pytest.mark.parametrize("cached", KINDS, indirect=True)
def test_a_released_or_forgotten_lease_is_not_kept(cached: Cached, scope: str) -> None:
    released = cached.face.claim(request(scope, key="r")).lease
    forgotten = cached.face.claim(request(scope, key="f")).lease
    assert len(cached.store._cache._claims) == 2
    cached.face.release(released)
    cached.face.forget(forgotten)
    assert cached.store._cache._claims == {}
    # The key released resumes with its next claim, whose finish is cached.
    again = cached.face.claim(request(scope, key="r"))
    assert again.outcome is Outcome.EXECUTE
    cached.face.finish(again.lease, response(3))
    assert cached.redis.get(cached.name(scope, "r")) is not None


def test_d11_finishes_on_the_cached_store_batch_as_the_primarys_do(
    pg_url: str, redis_url: str, redis_prefix: str, scope: str
) -> None:
    """32 finishes at once are two round trips to PostgreSQL, as on the primary alone
    (the first alone, the 31 that queued as one statement): before, each finish read
    its whole row back in a statement of its own, past the batching."""

    async def main() -> tuple[list[int], list[Any], list[Any]]:
        with round_trips(pg_url) as proxy:
            primary = AsyncPostgresStore(proxy.url, max_size=1)
            async with AsyncCachedStore(primary, redis_url, prefix=redis_prefix) as store:
                trips = []
                for round_ in range(WARM_UP + 1):
                    claims = await asyncio.gather(
                        *(store.claim(request(scope, f"r{round_}-{n}")) for n in range(32))
                    )
                    leases = [c.lease for c in claims if c.lease is not None]
                    assert len(leases) == 32
                    before = proxy.count
                    await asyncio.gather(
                        *(store.finish(lease, StoredResponse.of(201)) for lease in leases)
                    )
                    trips.append(proxy.count - before)
                keys = [request(scope, f"r{WARM_UP}-{n}") for n in range(32)]
                before = proxy.count
                replays = [await store.claim(key) for key in keys]
                assert proxy.count == before  # every one served by Redis
                truths = [await primary.claim(key) for key in keys]
        return trips, replays, truths

    trips, replays, truths = asyncio.run(main())
    assert trips[-1] == 2, trips
    assert replays == truths


@pytest.mark.parametrize("cached", KINDS, indirect=True)
def test_p3_a_finish_after_a_checkpoint_caches_the_row_as_it_is_then(
    cached: Cached, scope: str
) -> None:
    """A checkpoint changes the row after the claim (its recovery point, and
    ``last_run_at``): the claim's record is no longer the row, so the finish writes no
    entry built from it, and the first replay caches the primary's."""
    claim = cached.face.claim(request(scope))
    time.sleep(0.01)  # SQLite's clock has milliseconds: a later last_run_at, always
    with cached.face.transaction() as tx:
        lease = cached.face.checkpoint(tx, claim.lease, "charged")
    cached.face.finish(lease, response(4))
    truth = cached.primary.claim(request(scope))
    assert truth.record.last_run_at != claim.record.last_run_at
    assert cached.face.claim(request(scope)) == truth
    assert cached.face.claim(request(scope)) == truth
    assert cached.store.cache_stats.hits == 1
