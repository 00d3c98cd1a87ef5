"""A SQL store with Redis in front of it for replays (DESIGN 8: Cached).

Written once, async: the sync store is generated from this module (F7). The
decisions (what an entry says, when it is stale, a degraded cache) are in
`_store_shared`; this module only makes the Redis calls around the primary's
operations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

from ...observability import Instrumentation
from ...states import (
    Claim,
    ClaimRequest,
    KeyRecord,
    KeyStatus,
    Lease,
    Outcome,
    StagedJob,
    StoredResponse,
)
from .._sql.gate import ENDED
from .._sql.ops import Dialect, Op
from .._sql.store_async import AsyncStore, AsyncTransaction
from ..capabilities import Capability, capabilities_of
from ..redis._lane_async import AsyncLane
from ._store_shared import (
    CACHE_ERRORS,
    DEFAULT_CLOCK_SKEW,
    DEFAULT_PAUSE,
    DEFAULT_TIMEOUT,
    DEFAULT_TTL,
    NO_CONNECTION,
    SET_SCRIPT,
    AsyncRedis,
    Cache,
    CacheStats,
    close_redis_async,
    connect_redis_async,
    replica_wait,
)

T = TypeVar("T")


class AsyncCachedStore(AsyncStore):
    """A SQL key store (``primary``: PostgreSQL or SQLite, the source of truth) with a
    Redis cache of finished responses in front of it, for replays.

    ```python
    store = AsyncCachedStore(AsyncPostgresStore(url), "redis://localhost:6379/0")
    claim = await store.claim(request)   # a retry: one Redis GET, no SQL
    ```

    A claim first reads the key's entry in Redis: an entry of the same scope, key and
    fingerprint is a finished key, replayed as the primary would (P3), with no round
    trip to the primary. Anything else (no entry, another fingerprint: P2 is the
    primary's to decide, an unreadable entry, Redis down or slow) goes to the primary.
    Claims that may take the key, finishes and every fenced write go to the primary;
    a finish made here (not inside a transaction) of a claim made here is written to
    Redis after the primary committed it, and so is every replay the primary answered.
    That finish is the primary's own (batched as any finish is) and reads nothing
    back: the entry is the claim's record, which the store keeps until the lease
    settles, with what the finish wrote.

    It stands in for its primary everywhere: transactions, checkpoints, flows,
    request-as-transaction and the background services all run on the primary
    (``store.primary``), unchanged. Finishes inside a transaction (a flow's last
    phase, request-as-transaction) are cached by their first replay.

    ``redis`` is a ``redis://host:port/db`` URL, or
    ``redis+sentinel://host:port[,host:port...]/service[/db]`` for the master Redis
    Sentinel names, found again after a failover (the store opens the client, with
    ``timeout`` seconds to connect and to answer, and closes it), or a client of the
    application's, left open (``redis.asyncio.Redis`` for the async store,
    ``redis.Redis`` for the sync one). Its keys start with ``prefix``, then the scope.
    An entry lives at most ``ttl`` and ends ``clock_skew`` before its key expires, so
    the reaper never deletes a row whose entry is still served. A failed or slow Redis
    is counted ([`cache_stats`][idempotence.AsyncCachedStore.cache_stats], the ``cache``
    hook of the primary's instrumentation), logged now and then, and not asked again for
    ``pause`` seconds: the primary answers alone, never an error. Evicting a key
    ([`evict_key`][idempotence.maintenance.admin.evict_key], ``idempotence keys evict
    --cache URL``) must go through this store, which stores a tombstone first: the CLI
    on the database alone cannot reach the cache.

    ``replicas=N`` (or ``?replicas=N`` in the URL, with ``replica_timeout``, as for the
    Redis store) makes that tombstone wait until N replicas of the cache have it
    (``WAIT``): a tombstone only the master held would be lost with it, and the
    promoted replica would replay the evicted key's old response. Fewer than N
    evicts nothing (StoreUnavailable). Entries need no wait: one lost is a miss, and a
    replica holds an entry only with every tombstone written before it.
    """

    capabilities = frozenset({Capability.TRANSACTIONS, Capability.WAITING})
    """Those of the primary, for which the store stands in: a store's own
    ``capabilities`` are its primary's (LISTENING too, in front of a PostgreSQL store
    that listens: its finishes are the primary's, and so are its NOTIFYs)."""

    def __init__(
        self,
        primary: AsyncStore,
        redis: str | AsyncRedis,
        *,
        prefix: str = "idempotence:cache",
        ttl: timedelta = DEFAULT_TTL,
        clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
        timeout: float = DEFAULT_TIMEOUT,
        pause: float = DEFAULT_PAUSE,
        replicas: int = 0,
        replica_timeout: float | None = None,
    ) -> None:
        # Deliberately no super().__init__(): every method is the primary's, or
        # wraps it, so the base class's connection state is never used.
        if not isinstance(primary, AsyncStore) or isinstance(primary, AsyncCachedStore):
            raise TypeError(
                f"the primary of AsyncCachedStore is a SQL AsyncStore (PostgreSQL or "
                f"SQLite), not {type(primary).__name__}"
            )
        self.primary = primary
        self.capabilities = capabilities_of(primary)
        self._cache = Cache(
            prefix,
            ttl=ttl,
            clock_skew=clock_skew,
            pause=pause,
            instrumentation=primary.instrumentation,
        )
        redis, self._wait = replica_wait(redis, timeout, replicas, replica_timeout)
        self._redis, self._owns_redis, direct = connect_redis_async(redis, timeout)
        self._set = self._redis.register_script(SET_SCRIPT)
        # A plain server's client the store opened: its GET and its writes go past
        # redis-py's per-command machinery (see redis/_lane_async.py).
        self._lane = AsyncLane.of(self._redis) if direct else None

    @property
    def cache_stats(self) -> CacheStats:
        """Hits, misses, errors and skipped calls of the cache since the store opened."""
        return self._cache.stats

    async def claim(self, request: ClaimRequest, *, tx: AsyncTransaction | None = None) -> Claim:
        """A replay from Redis when it holds the request's finished key; otherwise
        the primary's claim (and a replay it answers is cached). Given ``tx``, the
        primary's claim in that transaction, as on the primary."""
        if tx is not None:
            return await self.primary.claim(request, tx=tx)
        name = self._cache.name(request.scope, request.key)
        cached, found = await self._cached(request, name)
        if cached is not None:
            return cached
        claim = await self.primary.claim(request)
        if claim.outcome is Outcome.REPLAY:
            await self._put(name, self._cache.entry(claim.record))
        elif self._cache.stale(found, claim):
            await self._put(name, self._cache.tombstone(claim.record.id - 1))
        if claim.outcome is Outcome.EXECUTE:
            self._cache.claimed(claim)
        return claim

    async def finish(
        self,
        lease: Lease,
        response: StoredResponse,
        *,
        tx: AsyncTransaction | None = None,
        error: str | None = None,
        at_commit: bool = False,
    ) -> None:
        """The primary's finish; then, unless it is part of ``tx``, the finished
        record is written to Redis (it is committed: the cache only ever holds what
        the primary holds)."""
        claimed = self._cache.settled(lease)
        if tx is not None or at_commit or claimed is None:
            # A finish in a transaction, or of a claim not made here: its first replay
            # is cached.
            await self.primary.finish(lease, response, tx=tx, error=error, at_commit=at_commit)
            return
        # The primary's plain finish, batched as it is (DESIGN 11), returning only the
        # two times it sets: the rest of the finished row is the claim's record.
        finished_at, expires_at = await self.primary._finish_times(lease, response, error)
        record = self._cache.finished(claimed, response, error, finished_at, expires_at)
        await self._put(self._cache.name(lease.scope, lease.key), self._cache.entry(record))

    async def _finish_times(
        self, lease: Lease, response: StoredResponse, error: str | None
    ) -> tuple[datetime, datetime | None]:
        return await self.primary._finish_times(lease, response, error)

    async def _finish_own(self, lease: Lease, op: Callable[[], Op[T]]) -> T:
        return await self.primary._finish_own(lease, op)

    async def _invalidate(self, scope: str, key: str, key_id: int) -> None:
        """Store a tombstone that refuses the entries of row ``key_id`` and older;
        raises [`StoreUnavailable`][idempotence.errors.StoreUnavailable] if Redis cannot be
        reached, or with ``replicas`` if fewer replicas acknowledged the tombstone (the
        caller then deletes nothing)."""
        value, until = self._cache.tombstone(key_id)
        name = self._cache.name(scope, key)
        try:
            if self._wait.replicas:
                acked = await self._store_waited(name, [value, until])
                if acked < self._wait.replicas:
                    raise self._cache.unreplicated(self._wait, acked)
            else:
                await self._store_entry(name, [value, until])
        except CACHE_ERRORS as exc:
            raise self._cache.refuse(exc) from exc
        await self.primary._invalidate(scope, key, key_id)

    async def _store_waited(self, name: bytes, args: list[Any]) -> int:
        """``SET_SCRIPT`` and ``WAIT``, on one connection (WAIT counts the replicas
        that have that connection's writes) and in one round trip, never the lane's
        (its one connection carries every request's GET); how many acknowledged it.
        EVAL, not EVALSHA: an eviction is rare, and a restarted server has no script."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.eval(SET_SCRIPT, 1, name, *args)
            pipe.wait(self._wait.replicas, self._wait.timeout_ms)
            replies = await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return int(replies[1])

    async def _cached(
        self, request: ClaimRequest, name: bytes
    ) -> tuple[Claim | None, bytes | None]:
        """The replay Redis answers for ``request`` (whose Redis key is ``name``), or
        None; and what Redis held."""
        # The primary's rules first: closed, or inside this task's open transaction,
        # a store refuses every operation of its own, a replay from Redis included.
        self.primary._gate.check()
        found = await self._get(name)
        return self._cache.replay(found, request), found

    async def _get(self, name: bytes) -> bytes | None:
        if not self._cache.available():
            return None
        try:
            if self._lane is not None:
                value = await self._lane.execute("GET", name)
            else:
                value = await self._redis.get(name)
        except CACHE_ERRORS as exc:
            self._cache.failed("get", exc)
            return None
        # An entry is ASCII: a client that decodes responses hands back the same text.
        return value.encode() if isinstance(value, str) else value

    async def _put(self, name: bytes, entry: tuple[bytes, int] | None) -> None:
        if entry is None or not self._cache.available():
            return
        try:
            await self._store_entry(name, list(entry))
        except CACHE_ERRORS as exc:
            self._cache.failed("set", exc)

    async def _store_entry(self, name: bytes, args: list[Any]) -> None:
        """Run ``SET_SCRIPT``: store an entry or a tombstone unless a higher floor
        is there."""
        if self._lane is not None:
            await self._lane.evalsha(self._set, [name], args)
        else:
            await self._set(keys=[name], args=args)

    # -- the rest is the primary's ---------------------------------------------------

    @asynccontextmanager
    async def transaction(
        self, *, claim: ClaimRequest | None = None, finished: StoredResponse | None = None
    ) -> AsyncIterator[AsyncTransaction]:
        """The primary's transaction. Given ``claim``, a replay is first looked up in
        Redis: found, no transaction opens, and ``tx`` (whose ``claim`` is the replay)
        must not be written to, as when the primary's claim finds the key held (F8).
        A replay the primary's claim answers is cached once the transaction ends."""
        if claim is not None:
            cached, _ = await self._cached(claim, self._cache.name(claim.scope, claim.key))
            if cached is not None:
                tx = AsyncTransaction(NO_CONNECTION, self.primary._dialect, cached)
                try:
                    yield tx
                finally:
                    tx._conn = ENDED  # as the primary's transactions end (_nesting.ENDED)
                return
        async with self.primary.transaction(claim=claim, finished=finished) as tx:
            yield tx
        if tx.claim is not None and tx.claim.outcome is Outcome.REPLAY:
            record = tx.claim.record
            await self._put(self._cache.name(record.scope, record.key), self._cache.entry(record))

    async def checkpoint(
        self,
        tx: AsyncTransaction,
        lease: Lease,
        recovery_point: str,
        *,
        calling: str | None = None,
    ) -> Lease:
        # The row changes (its recovery point, last_run_at): the claim's record is no
        # longer it, so the finish caches nothing of its own (the first replay does).
        self._cache.settled(lease)
        return await self.primary.checkpoint(tx, lease, recovery_point, calling=calling)

    async def release(self, lease: Lease) -> None:
        self._cache.settled(lease)
        await self.primary.release(lease)

    async def heartbeat(self, lease: Lease) -> datetime:
        return await self.primary.heartbeat(lease)

    async def end_phase(
        self,
        tx: AsyncTransaction,
        lease: Lease,
        *,
        jobs: Sequence[tuple[str, str, Any]] = (),
        recovery_point: str | None = None,
        response: StoredResponse | None = None,
    ) -> Lease:
        self._cache.settled(lease)  # as in checkpoint
        return await self.primary.end_phase(
            tx, lease, jobs=jobs, recovery_point=recovery_point, response=response
        )

    async def forget(self, lease: Lease) -> None:
        self._cache.settled(lease)
        await self.primary.forget(lease)

    async def stage_jobs(
        self, tx: AsyncTransaction, lease: Lease, jobs: list[tuple[str, str, Any]]
    ) -> None:
        await self.primary.stage_jobs(tx, lease, jobs)

    async def take_staged_jobs(self, tx: AsyncTransaction, limit: int = 100) -> list[StagedJob]:
        return await self.primary.take_staged_jobs(tx, limit)

    async def get(self, scope: str, key: str) -> KeyRecord | None:
        """The primary's record: the truth, never the cache's copy."""
        return await self.primary.get(scope, key)

    async def key_status(self, scope: str, key: str) -> KeyStatus | None:
        """The primary's status: the truth, never the cache's copy."""
        return await self.primary.key_status(scope, key)

    async def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        await self.primary.wait_for_settle(scope, key, seconds)

    @property
    def instrumentation(self) -> Instrumentation | None:
        return self.primary.instrumentation

    async def _perform(
        self,
        make_op: Callable[[Dialect], Op[T]],
        *,
        tx: AsyncTransaction | None = None,
        write: bool = True,
    ) -> T:
        return await self.primary._perform(make_op, tx=tx, write=write)

    async def migrate(self) -> list[str]:
        return await self.primary.migrate()

    async def close(self) -> None:
        """Close the primary, and the Redis client if the store opened it."""
        try:
            await self.primary.close()
        finally:
            if self._owns_redis:
                if self._lane is not None:
                    await self._lane.close()
                await close_redis_async(self._redis)

    async def __aenter__(self) -> AsyncCachedStore:
        return self
