"""CachedStore's own promises (DESIGN 8: Cached), on real PostgreSQL, SQLite and Redis.

* a replay served from Redis is the primary's answer, and touches the primary not at
  all (a closed primary; on PostgreSQL, a proxy that counts round trips);
* a stale, foreign or unreadable entry never yields a wrong answer: it costs a read of
  the primary, and an entry of an older row is replaced when seen;
* eviction (through the cache) and the key's expiry take its entry with them, and a
  late writer cannot bring an entry of a deleted row back;
* Redis down (a redis-server of the test's own, killed mid-run): every request is
  still answered correctly by the primary, and the degradation is counted and logged
  once, not per request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from idempotence import (
    AsyncSqliteStore,
    AsyncStore,
    ClaimRequest,
    Instrumentation,
    LockLost,
    Outcome,
    SqliteStore,
    Store,
    StoredResponse,
    StoreInTransaction,
    StoreUnavailable,
)
from idempotence.maintenance import admin
from idempotence.maintenance.reaper import Reaper
from idempotence.stores.cached import AsyncCachedStore, CachedStore
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from tests.support.redis import redis_server
from tests.support.roundtrips import round_trips
from tests.support.stores import Blocking, EventLoopThread
from tests.test_store_concurrency import CONCURRENCY, TRIALS, race_with_threads

FP = "a" * 64
OTHER_FP = "b" * 64
KINDS = ["postgres-sync", "postgres-async", "sqlite-sync", "sqlite-async"]
PRIMARIES: dict[tuple[str, str], Any] = {
    ("postgres", "sync"): PostgresStore,
    ("postgres", "async"): AsyncPostgresStore,
    ("sqlite", "sync"): SqliteStore,
    ("sqlite", "async"): AsyncSqliteStore,
}


def request(scope: str, key: str = "k", fingerprint: str = FP, **kw: Any) -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint=fingerprint, **kw)


claim_request = request


def response(n: int) -> StoredResponse:
    return StoredResponse.of(201, {"content-type": "application/json"}, f'{{"n": {n}}}')


class Events(Instrumentation):
    """Records the cache events the store reports."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def cache(self, event: str) -> None:
        self.events.append(event)


@dataclass
class Cached:
    """A cached store under test: its sync face, the store, and its primary's face."""

    kind: str
    face: Any
    store: CachedStore | AsyncCachedStore
    primary: Any
    redis: redis.Redis
    events: Events

    @property
    def backend(self) -> str:
        return self.kind.split("-")[0]

    def name(self, scope: str, key: str = "k") -> bytes:
        return self.store._cache.name(scope, key)

    def put(self, name: bytes, entry: tuple[bytes, int] | None) -> None:
        """The store's own guarded write to Redis (as a late writer would make it)."""
        if isinstance(self.store, CachedStore):
            self.store._put(name, entry)
        else:
            self.face._run(self.store._put(name, entry))

    def delete_row(self, scope: str, key: str = "k") -> None:
        """Delete the key's row in the primary behind the cache's back."""
        mark = (lambda n: f"%({n})s") if self.backend == "postgres" else (lambda n: f":{n}")
        with self.primary.transaction() as tx:
            tx.execute(
                f"DELETE FROM idempotency_keys WHERE scope = {mark('s')} AND key = {mark('k')}",
                {"s": scope, "k": key},
            )


@contextmanager
def open_cached(
    kind: str, request_: pytest.FixtureRequest, loop: EventLoopThread, url: str, **kw: Any
) -> Iterator[Cached]:
    """A cached store of ``kind`` on Redis at ``url``, closed (with its client) after."""
    backend, flavour = kind.split("-")
    target = request_.getfixturevalue("pg_url" if backend == "postgres" else "sqlite_path")
    events = Events()
    primary = PRIMARIES[backend, flavour](target, instrumentation=events)
    cls: Any = CachedStore if flavour == "sync" else AsyncCachedStore
    store = cls(primary, url, **kw)
    face = store if flavour == "sync" else Blocking(store, loop)
    primary_face = primary if flavour == "sync" else Blocking(primary, loop)
    made = Cached(kind, face, store, primary_face, redis.Redis.from_url(url), events)
    try:
        yield made
    finally:
        made.face.close()
        made.redis.close()


@pytest.fixture(params=KINDS)
def cached(
    request: pytest.FixtureRequest,
    loop_thread: EventLoopThread,
    redis_url: str,
    redis_prefix: str,
) -> Iterator[Cached]:
    with open_cached(request.param, request, loop_thread, redis_url, prefix=redis_prefix) as made:
        yield made


# -- a replay from the cache ----------------------------------------------------------------


class CountingSource:
    """A store's connection source that counts the connections taken from it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.taken = 0

    def connection(self) -> Any:
        self.taken += 1
        return self.inner.connection()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_cached_replay_is_the_primarys_answer_and_needs_no_primary(
    cached: Cached, scope: str
) -> None:
    lease = cached.face.claim(request(scope)).lease
    cached.face.finish(lease, response(1))  # written through to Redis
    truth = cached.primary.claim(request(scope))
    assert truth.outcome is Outcome.REPLAY
    source = CountingSource(cached.store.primary._source)
    cached.store.primary._source = source
    for _ in range(3):
        assert cached.face.claim(request(scope)) == truth  # the whole record, too
    with cached.face.transaction(claim=request(scope)) as tx:  # request-as-transaction
        assert tx.claim == truth
    assert source.taken == 0
    assert cached.store.cache_stats.hits == 4
    assert cached.events.events.count("hit") == 4
    # ... and the count is real: a claim the cache cannot answer takes a connection.
    cached.face.claim(request(scope, key="other"))
    assert source.taken > 0


def test_a_closed_cached_store_refuses_even_a_cached_replay(cached: Cached, scope: str) -> None:
    cached.face.finish(cached.face.claim(request(scope)).lease, response(1))
    cached.face.close()
    with pytest.raises(StoreUnavailable):
        cached.face.claim(request(scope))


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_cached_replay_makes_no_round_trip_to_postgres(
    flavour: str,
    pg_url: str,
    redis_url: str,
    redis_prefix: str,
    loop_thread: EventLoopThread,
    scope: str,
) -> None:
    with round_trips(pg_url) as proxy:
        # One connection: a pool that may grow sets up its second one (two trips)
        # whenever the machine lets it, perhaps inside the count.
        primary: Any = (PostgresStore if flavour == "sync" else AsyncPostgresStore)(
            proxy.url, max_size=1
        )
        cls: Any = CachedStore if flavour == "sync" else AsyncCachedStore
        store = cls(primary, redis_url, prefix=redis_prefix)
        face: Any = store if flavour == "sync" else Blocking(store, loop_thread)
        try:
            face.finish(face.claim(request(scope)).lease, response(1))
            before = proxy.count
            for _ in range(5):
                assert face.claim(request(scope)).outcome is Outcome.REPLAY
            assert proxy.count == before
            # ... and the proxy does count: a claim the cache cannot answer is a trip.
            face.claim(request(scope, key="other"))
            assert proxy.count > before
        finally:
            face.close()


def test_a_replay_the_primary_answered_is_cached_for_the_next(cached: Cached, scope: str) -> None:
    # Finished on the primary alone (another node, the completer): not in Redis yet.
    lease = cached.primary.claim(request(scope)).lease
    cached.primary.finish(lease, response(2))
    assert cached.face.claim(request(scope)).response == response(2)
    assert cached.store.cache_stats.hits == 0
    assert cached.face.claim(request(scope)).response == response(2)
    assert cached.store.cache_stats.hits == 1


def test_a_cached_replay_inside_the_stores_open_transaction_is_refused_as_on_the_primary(
    cached: Cached, scope: str
) -> None:
    cached.face.finish(cached.face.claim(request(scope)).lease, response(1))
    assert cached.face.claim(request(scope)).outcome is Outcome.REPLAY  # cached
    with cached.face.transaction():
        with pytest.raises(StoreInTransaction):
            cached.face.claim(request(scope))
        with pytest.raises(StoreInTransaction), cached.face.transaction(claim=request(scope)):
            pass


# -- stale, foreign and unreadable entries ------------------------------------------------


def test_p2_an_entry_of_another_fingerprint_is_decided_by_the_primary(
    cached: Cached, scope: str
) -> None:
    cached.face.finish(cached.face.claim(request(scope)).lease, response(1))
    claim = cached.face.claim(request(scope, fingerprint=OTHER_FP))
    assert claim.outcome is Outcome.MISMATCH
    assert cached.store.cache_stats.hits == 0


@pytest.mark.parametrize(
    "poison",
    [
        b"garbage",
        b"E" + b"0" * 20 + b"{not json",
        b"E00000000000000000001{}",
        b"E00000000000000000001[]",  # JSON, but not an object
        b'E00000000000000000001"x"',
        b"T" + b"9" * 20,  # a tombstone: nothing to replay
        "another key's entry",
        "another scope's entry",
        "this key's entry with a mangled id",
    ],
)
def test_an_entry_that_is_not_exactly_this_keys_falls_through(
    cached: Cached, scope: str, poison: Any
) -> None:
    # The key is in progress on the primary; whatever Redis says, no replay.
    cached.face.claim(request(scope))
    if isinstance(poison, str):
        poison_name = poison
        other_scope, other_key = (scope + "x", "k") if "scope" in poison else (scope, "k2")
        lease = cached.face.claim(request(other_scope, key=other_key)).lease
        cached.face.finish(lease, response(9))
        poison = cached.redis.get(cached.name(other_scope, other_key))
        assert poison is not None
        if "mangled" in poison_name:
            record = cached.store._cache.entry_record(poison)
            assert record is not None
            entry = cached.store._cache.entry(replace(record, scope=scope, key="k"))
            assert entry is not None
            poison = b"E" + b"x" * 20 + entry[0][21:]
    cached.redis.set(cached.name(scope), poison)
    assert cached.face.claim(request(scope)).outcome is Outcome.IN_PROGRESS


def test_an_unreadable_entry_is_replaced_by_the_primarys_replay(cached: Cached, scope: str) -> None:
    cached.face.finish(cached.face.claim(request(scope)).lease, response(1))
    cached.redis.set(cached.name(scope), b"garbage")
    assert cached.face.claim(request(scope)).response == response(1)  # from the primary
    assert cached.face.claim(request(scope)).response == response(1)  # from Redis again
    assert cached.store.cache_stats.hits == 1


def test_an_entry_of_an_older_row_is_replaced_when_the_primary_shows_a_newer_one(
    cached: Cached, scope: str
) -> None:
    """The row behind an entry deleted without the cache being told (what ``keys
    evict`` without ``--cache`` does), then the key reused by another request: the
    claim that falls through sees a newer row, and the old entry goes, so the old
    request is answered by the primary (P2), not by its old response."""
    cached.face.finish(cached.face.claim(request(scope)).lease, response(1))
    cached.delete_row(scope)
    newer = cached.face.claim(request(scope, fingerprint=OTHER_FP))
    assert newer.outcome is Outcome.EXECUTE
    assert cached.face.claim(request(scope)).outcome is Outcome.MISMATCH
    cached.face.finish(newer.lease, response(2))
    assert cached.face.claim(request(scope, fingerprint=OTHER_FP)).response == response(2)
    assert cached.store.cache_stats.hits == 1


# -- eviction, expiry, late writers --------------------------------------------------------


#: The admin operations (and the CLI) are sync: the sync cached stores.
SYNC_ONLY = pytest.mark.parametrize("cached", ["postgres-sync", "sqlite-sync"], indirect=True)


@pytest.mark.parametrize("taker_first", [True, False], ids=["taker-first", "zombie-first"])
def test_f1_a_zombies_refused_finish_puts_nothing_in_the_cache(
    cached: Cached, scope: str, taker_first: bool
) -> None:
    store, short = cached.face, timedelta(milliseconds=300)
    zombie = store.claim(request(scope, lock_timeout=short)).lease
    time.sleep(0.4)
    taker = store.claim(request(scope)).lease  # took over: the zombie's token is stale
    assert taker.token == zombie.token + 1
    if taker_first:
        store.finish(taker, response(2))
    with pytest.raises(LockLost):
        store.finish(zombie, response(666))
    if not taker_first:
        # Still the taker's to finish: a replay here would answer the zombie's work.
        assert store.claim(request(scope)).outcome is Outcome.IN_PROGRESS
        store.finish(taker, response(2))
    for _ in range(3):  # from the cache, which the taker's finish wrote
        assert store.claim(request(scope)).response == response(2)


@SYNC_ONLY
def test_evict_through_the_cache_forgets_the_response(cached: Cached, scope: str) -> None:
    store = cached.face
    lease = store.claim(request(scope)).lease
    store.finish(lease, response(1))
    old = store.get(scope, "k")
    assert store.claim(request(scope)).outcome is Outcome.REPLAY
    admin.evict_key(store, scope, "k")
    claim = store.claim(request(scope))
    assert claim.outcome is Outcome.EXECUTE and claim.lease.token == 1  # afresh
    # A late writer (a replay read from the primary before the eviction) is refused.
    cached.put(cached.name(scope), cached.store._cache.entry(old))
    assert store.claim(request(scope)).outcome is Outcome.IN_PROGRESS
    store.finish(claim.lease, response(2))
    assert store.claim(request(scope)).response == response(2)
    assert store.claim(request(scope)).response == response(2)


@SYNC_ONLY
def test_evict_deletes_only_the_row_whose_response_it_refused(cached: Cached, scope: str) -> None:
    # Between the eviction's refusal of row X's cached response and its DELETE, X goes
    # (another eviction) and a new request's row Y is finished and cached. Deleting Y
    # too would leave Y's response in the cache, replayed for a row that is gone.
    store = cached.store
    assert isinstance(store, CachedStore)
    store.finish(store.claim(request(scope)).lease, response(1))
    refuse = store._invalidate

    def meanwhile(scope_: str, key: str, row_id: int) -> None:
        refuse(scope_, key, row_id)
        store._invalidate = refuse  # type: ignore[method-assign]
        admin.evict_key(store, scope, "k")  # X goes
        taken = store.claim(request(scope, fingerprint="b" * 64)).lease  # row Y
        store.finish(taken, response(2))

    store._invalidate = meanwhile  # type: ignore[method-assign]
    evicted = admin.evict_key(store, scope, "k")
    # It evicted the key as it now was (Y, refused from the cache first), not X again.
    assert evicted.record.response == response(2)
    assert store.get(scope, "k") is None
    again = store.claim(request(scope, fingerprint="b" * 64))
    assert again.outcome is Outcome.EXECUTE, again.response


@SYNC_ONLY
def test_evict_is_refused_while_the_cache_is_down(
    cached: Cached, scope: str, tmp_path: Path
) -> None:
    with redis_server() as server:
        store = CachedStore(cached.face.primary, server.url, prefix="evict")
        store.finish(store.claim(request(scope)).lease, response(1))
        server.stop()
        with pytest.raises(StoreUnavailable, match="nothing was evicted"):
            admin.evict_key(store, scope, "k")
    assert cached.face.get(scope, "k") is not None


def test_entries_end_with_the_retention_minus_the_clock_skew(
    request: pytest.FixtureRequest, loop_thread: EventLoopThread, redis_url: str, redis_prefix: str
) -> None:
    with open_cached(
        "sqlite-sync",
        request,
        loop_thread,
        redis_url,
        prefix=redis_prefix,
        clock_skew=timedelta(seconds=1),
        ttl=timedelta(seconds=30),
    ) as made:
        store = made.face
        lease = store.claim(claim_request("s", retention=timedelta(seconds=2))).lease
        store.finish(lease, response(1))
        assert 0 < made.redis.pttl(made.name("s")) <= 1000
        forever = store.claim(claim_request("s", key="f", retention=None)).lease
        store.finish(forever, response(2))
        assert 25_000 < made.redis.pttl(made.name("s", "f")) <= 30_000  # the ttl caps it
        time.sleep(2.2)  # the key expires; its entry went a second before
        assert made.redis.get(made.name("s")) is None
        assert Reaper(store).run_once().deleted >= 1  # through the cached store
        assert store.claim(claim_request("s")).outcome is Outcome.EXECUTE  # not the old replay


@pytest.mark.parametrize("kind", ["postgres-sync", "sqlite-sync"])
def test_a_late_writer_of_an_evicted_row_stays_refused_after_a_newer_entry_expires(
    kind: str,
    request: pytest.FixtureRequest,
    loop_thread: EventLoopThread,
    redis_url: str,
    redis_prefix: str,
) -> None:
    # The eviction's tombstone is the floor that refuses row X's entry. A newer row Y's
    # entry replaces it, and Y's entry may live a shorter time than the tombstone
    # would have: once it was gone, nothing refused X's entry any more.
    skew = timedelta(seconds=8)
    with open_cached(
        kind, request, loop_thread, redis_url, prefix=redis_prefix, clock_skew=skew
    ) as made:
        store = made.face
        primary = store.primary
        primary.finish(primary.claim(claim_request("s")).lease, response(1))
        late = made.store._cache.entry(primary.get("s", "k"))  # read before the eviction
        admin.evict_key(store, "s", "k")
        other = claim_request("s", fingerprint="b" * 64, retention=timedelta(seconds=10))
        store.finish(store.claim(other).lease, response(2))  # its entry: about 2 s
        hits = made.store.cache_stats.hits
        assert store.claim(other).outcome is Outcome.REPLAY
        assert made.store.cache_stats.hits == hits + 1  # Y's entry is there, over X's floor
        time.sleep(2.3)  # Y's entry is past its own expiry (its row lives 10 s)
        made.put(made.name("s"), late)  # the late writer
        again = store.claim(claim_request("s"))
        assert again.outcome is Outcome.MISMATCH, again.response  # the primary's answer
        # And Y's entry, kept as a floor, is not replayed past its own expiry.
        hits = made.store.cache_stats.hits
        assert store.claim(other).outcome is Outcome.REPLAY  # from the primary
        assert made.store.cache_stats.hits == hits


# -- Redis down ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_redis_down_degrades_to_the_primary_counted_and_logged_once(
    kind: str,
    request: pytest.FixtureRequest,
    loop_thread: EventLoopThread,
    tmp_path: Path,
    scope: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        redis_server() as server,
        open_cached(kind, request, loop_thread, server.url, prefix="down", pause=0.2) as made,
    ):
        store = made.face
        store.finish(store.claim(claim_request(scope, key="before")).lease, response(1))
        assert store.claim(claim_request(scope, key="before")).response == response(1)
        assert made.store.cache_stats.hits == 1
        server.stop()  # mid-run: every later request must still be answered rightly
        with caplog.at_level(logging.WARNING, logger="idempotence.cache"):
            for i in range(20):
                started = time.monotonic()
                replay = store.claim(claim_request(scope, key="before"))
                assert replay.outcome is Outcome.REPLAY and replay.response == response(1)
                fresh = store.claim(claim_request(scope, key=f"new-{i}"))
                assert fresh.outcome is Outcome.EXECUTE
                store.finish(fresh.lease, response(i))
                again = store.claim(claim_request(scope, key=f"new-{i}"))
                assert again.outcome is Outcome.REPLAY and again.response == response(i)
                mismatch = store.claim(claim_request(scope, key=f"new-{i}", fingerprint=OTHER_FP))
                assert mismatch.outcome is Outcome.MISMATCH
                assert time.monotonic() - started < 2.0  # short timeouts, no retries
                time.sleep(0.02)
        stats = made.store.cache_stats
        assert stats.errors >= 2 and stats.skipped >= 1  # counted, and paused between
        assert made.events.events.count("error") == stats.errors
        warnings = [r for r in caplog.records if r.name == "idempotence.cache"]
        assert len(warnings) == 1  # rate-limited: not one line per request
        assert "primary store alone" in warnings[0].getMessage()

        server.start()  # back (empty: no persistence): the cache fills again
        time.sleep(0.3)  # the pause after the last failure
        store.claim(claim_request(scope, key="before"))  # a miss that refills
        hits = made.store.cache_stats.hits
        assert store.claim(claim_request(scope, key="before")).response == response(1)
        assert made.store.cache_stats.hits == hits + 1


@pytest.mark.parametrize("kind", ["postgres-async", "sqlite-sync"])
def test_a_redis_that_hangs_costs_a_request_its_short_timeout_at_most(
    kind: str,
    request: pytest.FixtureRequest,
    loop_thread: EventLoopThread,
    tmp_path: Path,
    scope: str,
) -> None:
    with (
        redis_server() as server,
        open_cached(kind, request, loop_thread, server.url, prefix="hang", pause=0.5) as made,
    ):
        store = made.face
        try:
            store.finish(store.claim(claim_request(scope)).lease, response(1))
            server.freeze()  # connections stay open; nothing answers
            started = time.monotonic()
            for _ in range(10):
                assert store.claim(claim_request(scope)).response == response(1)
            elapsed = time.monotonic() - started
            # One timeout (0.25 s) for the first; the pause spares the others.
            assert 0.2 <= elapsed < 1.5, elapsed
            assert made.store.cache_stats.errors == 1 and made.store.cache_stats.skipped >= 9
        finally:
            server.freeze(False)


@pytest.mark.parametrize("kind", KINDS)
def test_a_redis_that_refuses_writes_fails_no_finish_and_no_replay(
    kind: str, request: pytest.FixtureRequest, loop_thread: EventLoopThread, scope: str
) -> None:
    with (
        redis_server() as server,
        open_cached(kind, request, loop_thread, server.url, prefix="full", pause=0.05) as made,
    ):
        # Out of memory, evicting nothing: it answers reads and refuses every write
        # with an error reply (not a dropped connection).
        made.redis.config_set("maxmemory-policy", "noeviction")
        made.redis.config_set("maxmemory", 1)
        store = made.face
        for i in range(3):
            lease = store.claim(claim_request(scope, key=f"k{i}")).lease
            store.finish(lease, response(i))  # the primary committed: no error here
            replay = store.claim(claim_request(scope, key=f"k{i}"))
            assert replay.outcome is Outcome.REPLAY and replay.response == response(i)
            time.sleep(0.06)  # past the pause: every finish tries Redis again
        assert made.store.cache_stats.errors >= 3
        assert made.events.events.count("error") == made.store.cache_stats.errors


# -- keys of every shape ------------------------------------------------------------------


def test_hostile_keys_never_share_an_entry(cached: Cached, scope: str) -> None:
    # Pairs that would spell the same Redis key if scope and key were merely joined.
    pairs = [
        (scope + ":a", "b"),
        (scope, "a:b"),
        (scope + ":a:b", "c"),
        (scope, "{a}:b{c}"),
        (scope + "{", "}"),
        (scope, "\x01\x02\x7f é ☕ \\ ' \" % *?[]"),
    ]
    for n, (s, k) in enumerate(pairs):
        cached.face.finish(cached.face.claim(request(s, key=k)).lease, response(n))
    for n, (s, k) in enumerate(pairs):
        assert cached.face.claim(request(s, key=k)).response == response(n)
    assert len({cached.name(s, k) for s, k in pairs}) == len(pairs)
    assert cached.store.cache_stats.hits == len(pairs)


def test_a_key_too_long_for_the_primary_fails_as_on_the_primary(cached: Cached, scope: str) -> None:
    long_key = "k" * 10_000
    with pytest.raises(Exception) as on_primary:  # noqa: PT011 - whatever the primary says
        cached.primary.claim(request(scope, key=long_key))
    with pytest.raises(type(on_primary.value)):
        cached.face.claim(request(scope, key=long_key))
    assert cached.redis.get(cached.name(scope, long_key)) is None


# -- a stand-in for the SQL store ---------------------------------------------------------


@pytest.mark.parametrize(
    ("cached_class", "base"), [(CachedStore, Store), (AsyncCachedStore, AsyncStore)]
)
def test_every_operation_of_the_sql_store_is_the_primarys_or_wraps_it(
    cached_class: type, base: type
) -> None:
    """No operation falls back to the base class's own (the cached store has no
    connections of its own): a method added to Store must be delegated too."""
    inherited = [
        name
        for name, value in vars(base).items()
        # (A class attribute holding a type, such as _transaction_type, is no operation.)
        if (callable(value) and not isinstance(value, type)) or isinstance(value, property)
        if not name.startswith("__") or name in ("__aenter__", "__enter__")
        # The base class's helpers of its own methods (_send_batch: its batcher's), and
        # exits that call close().
        if name not in ("_own", "_claim", "_send_batch", "__aexit__", "__exit__")
        if name not in vars(cached_class)
    ]
    assert inherited == []


def test_the_wrong_primary_or_client_is_refused(redis_url: str, sqlite_path: str) -> None:
    sync = SqliteStore(sqlite_path)
    with pytest.raises(TypeError, match="SQL AsyncStore"):
        AsyncCachedStore(sync, redis_url)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"redis\.Redis client"):
        CachedStore(sync, redis.asyncio.Redis.from_url(redis_url))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefix"):
        CachedStore(sync, redis_url, prefix="")
    with pytest.raises(TypeError, match="SQL"):
        CachedStore(CachedStore(sync, redis_url), redis_url)
    sync.close()


# -- P6 under fire, through the cache -------------------------------------------------------


@pytest.fixture(params=["postgres", "sqlite"])
def racing(
    request: pytest.FixtureRequest, redis_url: str, redis_prefix: str
) -> Iterator[CachedStore]:
    if request.param == "postgres":
        primary: Store = PostgresStore(request.getfixturevalue("pg_url"), max_size=CONCURRENCY)
    else:
        primary = SqliteStore(request.getfixturevalue("sqlite_path"))
    with CachedStore(primary, redis_url, prefix=redis_prefix) as store:
        yield store


@pytest.mark.slow
def test_p6_32_concurrent_first_claims_200_times_through_the_cache(
    racing: CachedStore, scope: str
) -> None:
    race_with_threads(racing, scope, TRIALS)


@pytest.mark.slow
def test_p6_claims_racing_the_finish_and_the_cache_fill_get_one_answer(
    racing: CachedStore, scope: str
) -> None:
    """32 threads claim each key over and over while its winner finishes and the
    cache fills (write-through and read-through at once): one EXECUTE per key, then
    only IN_PROGRESS or the winner's own response."""
    barrier = threading.Barrier(CONCURRENCY)

    def worker(n: int) -> list[Any]:
        seen = []
        for trial in range(20):
            key = f"t{trial}"
            barrier.wait()
            for _ in range(5):
                got = racing.claim(request(scope, key=key))
                if got.outcome is Outcome.EXECUTE:
                    racing.finish(got.lease, response(1000 * trial + n))
                seen.append((key, got.outcome, got.response, n))
        return seen

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        seen = [item for items in pool.map(worker, range(CONCURRENCY)) for item in items]
    for trial in range(20):
        mine = [s for s in seen if s[0] == f"t{trial}"]
        winners = [n for _, outcome, _, n in mine if outcome is Outcome.EXECUTE]
        assert len(winners) == 1, (trial, winners)
        answers = {r for _, outcome, r, _ in mine if outcome is Outcome.REPLAY}
        assert answers <= {response(1000 * trial + winners[0])}
        assert {o for _, o, _, _ in mine} <= {Outcome.EXECUTE, Outcome.IN_PROGRESS, Outcome.REPLAY}
    assert racing.cache_stats.hits > 0
