"""The Redis cache of finished responses in front of a SQL store, without its I/O.

`_store_async` (and the generated `_store`) performs the Redis calls;
what they send and how an answer is judged lives here, once: the Redis key of a
(scope, key), the cache entry's encoding, its expiry, the floor that refuses stale
writes, and the bookkeeping of a degraded cache (counted, logged at most every
``LOG_EVERY`` seconds, skipped for ``pause`` seconds after a failure). The two spellings
of the Redis client (``connect_redis`` and ``connect_redis_async``) are here too (F7).

An entry is the whole finished [`KeyRecord`][idempotence.testing.harness.KeyRecord] (so
a replay served from Redis is the claim the primary would have returned), prefixed by
its row id: ``E`` + 20 digits + JSON. A tombstone is ``T`` + 20 digits: the lowest row
id whose entry may be stored. Row ids grow for one (scope, key) (a sequence on
PostgreSQL, ``AUTOINCREMENT`` on SQLite), so the one script that writes entries
(``SET_SCRIPT``) refuses any entry below the floor of what is there: an entry of a
deleted row never comes back, however late its writer.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import redis
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from ...errors import StoreError, StoreUnavailable
from ...observability import Instrumentation
from ...states import Claim, ClaimRequest, KeyRecord, Lease, Outcome, StoredResponse
from .._redis_url import sentinel_url
from ..redis._clients import check_timeout, open_client, open_sentinel
from ..redis._replicas import ReplicaWait, from_url, url_options
from ..redis._store_shared import EPOCH, MICROSECOND, AsyncSentinel, Sentinel

__all__ = ["AsyncRedis", "Redis"]

logger = logging.getLogger("idempotence.cache")

DEFAULT_TIMEOUT = 0.25
"""Redis waits at most this long (seconds) to connect or to answer: a slow cache
costs a request little before the primary answers alone."""
DEFAULT_PAUSE = 1.0
"""After a Redis failure, the cache is not asked for this long (seconds): while it is
down, requests pay nothing for it."""
DEFAULT_TTL = timedelta(hours=24)
"""The longest an entry lives, whatever the key's retention (kept forever: ledgers)."""
DEFAULT_CLOCK_SKEW = timedelta(seconds=60)
"""An entry expires this long before its key does, so that it is gone from Redis
before the reaper can delete the row, as long as the clocks of Redis and of the
database agree within it."""
LOG_EVERY = 10.0
"""A degraded cache logs one warning per this many seconds, not one per request."""
CLAIMS_KEPT = 10_000
"""The most claims whose record a cache keeps for their finish (see
`Cache.claimed`): far above the requests one process has in flight; past it
the oldest is dropped, and its finish is cached by its first replay instead."""

CACHE_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
"""What a failing Redis raises: redis-py's errors (connection refused, timeout, a
server error) and a socket's own."""

_VERSION = 1
_ENTRY = b"E"
_TOMBSTONE = b"T"
_DIGITS = 20
_JSON = json.JSONDecoder()
"""One decoder for every entry (json.loads of bytes sniffs their encoding first)."""

SET_SCRIPT = """
local current = redis.call('GET', KEYS[1])
local at = tonumber(ARGV[2])
if current then
  local kind = string.sub(current, 1, 1)
  if kind == 'E' or kind == 'T' then
    if string.sub(current, 2, 21) > string.sub(ARGV[1], 2, 21) then
      return 0
    end
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 then
      local now = redis.call('TIME')
      local until_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + left
      if until_ms > at then
        at = until_ms
      end
    end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', at)
return 1
"""
"""Store ARGV[1] (an entry or a tombstone) with absolute expiry ARGV[2] (Unix ms),
unless what is there is an entry or a tombstone of a higher floor (characters
2-21, the row id or the tombstone's lowest id, zero-padded so that strings compare
as numbers). Anything else there (a foreign value) is overwritten. What replaces an
entry or a tombstone keeps its expiry if that is later: the floor it held must last
as long, or a late writer of an older row could store that row once a shorter-lived
newer entry expired. An entry kept past its own expiry is a miss to its readers
(`Cache.replay`)."""


def connect_redis_async(target: str | AsyncRedis, timeout: float) -> tuple[AsyncRedis, bool, bool]:
    """The asyncio client for ``target`` (a ``redis://`` or ``redis+sentinel://`` URL,
    or a client); whether the store owns it (opened it from a URL, and so closes it);
    and whether it is a plain server's that the store opened, whose commands its lane
    may carry (a Sentinel's master is found again at each new connection, which the
    lane's one connection would never do)."""
    if isinstance(target, str):
        return _open(AsyncRedis, AsyncSentinel, target, timeout)
    if not isinstance(target, AsyncRedis):
        raise TypeError(
            f"AsyncCachedStore needs a redis:// URL or a redis.asyncio.Redis client, "
            f"not {type(target).__name__}"
        )
    return target, False, False


def connect_redis(target: str | Redis, timeout: float) -> tuple[Redis, bool, bool]:
    """The sync twin of `connect_redis_async`: a ``redis.Redis``."""
    if isinstance(target, str):
        return _open(Redis, Sentinel, target, timeout)
    if not isinstance(target, Redis):
        raise TypeError(
            f"CachedStore needs a redis:// URL or a redis.Redis client, not {type(target).__name__}"
        )
    return target, False, False


def replica_wait(
    target: Any, timeout: float, replicas: int, replica_timeout: float | None
) -> tuple[Any, ReplicaWait]:
    """``target`` without the URL's own options (``?replicas=``, ``?replica_timeout=``)
    and the wait they and the arguments ask of an eviction's tombstone (see
    `idempotence.stores.redis._replicas`); an application's client gives its own
    timeout, which the store does not know."""
    if isinstance(target, str):
        target, ours = url_options(target)
        replicas, replica_timeout = from_url(ours, replicas, replica_timeout)
        # The timeout checked first: its own error, not a TypeError of the default.
        return target, ReplicaWait.of(replicas, replica_timeout, check_timeout(timeout))
    return target, ReplicaWait.of(replicas, replica_timeout, None)


def _open(kind: Any, sentinel_kind: Any, url: str, timeout: float) -> tuple[Any, bool, bool]:
    sentinel = sentinel_url(url)
    if sentinel is not None:
        return open_sentinel(sentinel_kind, sentinel, _options(timeout)), True, False
    return open_client(kind, url, _options(timeout)), True, True


async def close_redis_async(client: AsyncRedis) -> None:
    """Close a client the store opened."""
    await client.aclose()


def close_redis(client: Redis) -> None:
    """The sync twin of `close_redis_async`."""
    client.close()


def _options(timeout: float) -> dict[str, Any]:
    # No retries: a failed call falls back to the primary at once, and the pause
    # keeps a down cache from being asked again for a while.
    timeout = check_timeout(timeout)
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": redis.retry.Retry(redis.backoff.NoBackoff(), 0),
        "retry_on_timeout": False,
    }


class _NoConnection:
    """The connection of a transaction that never opened because its claim was a
    replay served from Redis: there is nothing to write to (``tx.connection`` is
    None, and any statement raises)."""

    raw = None

    def __getattr__(self, name: str) -> Any:
        raise StoreError(
            "this transaction's claim was a replay served from the cache, so no "
            "transaction is open: write only when tx.claim.outcome is EXECUTE"
        )


NO_CONNECTION: Any = _NoConnection()
"""Stands in for the connection of a transaction whose claim the cache answered."""


class CacheStats:
    """What a cached store's Redis did since it was opened (also reported to the
    store's instrumentation as ``idempotence_cache_total{event}``)."""

    __slots__ = ("errors", "hits", "misses", "skipped")

    def __init__(self) -> None:
        #: Replays served from Redis.
        self.hits = 0
        #: Claims answered by the primary (nothing usable in Redis).
        self.misses = 0
        #: Redis calls that failed or timed out: answered by the primary alone.
        self.errors = 0
        #: Redis calls not made because a recent failure paused the cache.
        self.skipped = 0

    def __repr__(self) -> str:
        return (
            f"CacheStats(hits={self.hits}, misses={self.misses}, errors={self.errors}, "
            f"skipped={self.skipped})"
        )


class Cache:
    """The cache's decisions and bookkeeping: no I/O (the cached stores do it)."""

    def __init__(
        self,
        prefix: str,
        *,
        ttl: timedelta,
        clock_skew: timedelta,
        pause: float,
        instrumentation: Instrumentation | None,
    ) -> None:
        if not prefix:
            raise ValueError("the cache's prefix must not be empty (no global namespace)")
        if ttl <= timedelta(0) or clock_skew < timedelta(0) or pause < 0:
            raise ValueError("ttl must be positive; clock_skew and pause not negative")
        self._prefix = prefix.encode("utf-8", "surrogatepass") + b":"
        self._ttl = ttl
        self._skew = clock_skew
        self._pause = pause
        self._instrumentation = instrumentation
        self._paused_until = 0.0
        self._lock = threading.Lock()
        self._logged_at = -LOG_EVERY
        self._unlogged = 0
        #: The record of each claim made through the store and not yet settled, by
        #: its lease (see `claimed`).
        self._claims: OrderedDict[tuple[str, str, int, int], KeyRecord] = OrderedDict()
        self.stats = CacheStats()

    def name(self, scope: str, key: str) -> bytes:
        """The Redis key of (scope, key): the prefix, then the scope's length, so
        that no (scope, key) pair can spell another's. Any text is safe, lone
        surrogates included, and no character is special."""
        s = scope.encode("utf-8", "surrogatepass")
        k = key.encode("utf-8", "surrogatepass")
        return b"%s%d:%s:%s" % (self._prefix, len(s), s, k)

    # -- reading ---------------------------------------------------------------------

    def replay(self, value: bytes | None, request: ClaimRequest) -> Claim | None:
        """The REPLAY that ``value`` (what Redis holds for the request's key) answers,
        or None when the primary must decide: no entry, a tombstone, an entry of
        another scope, key or fingerprint (P2 is the primary's), or one unreadable."""
        record = self.entry_record(value)
        if (
            record is None
            or record.scope != request.scope
            or record.key != request.key
            or record.fingerprint != request.fingerprint
            # Kept past its own expiry as a floor (SET_SCRIPT): the reaper may have
            # deleted its row.
            or self._until_ms(record) <= time.time() * 1000
        ):
            self._count("miss")
            return None
        self._count("hit")
        claim = Claim(Outcome.REPLAY, record)
        if self._instrumentation is not None:
            with self._instrumentation.claim(request) as watch:
                watch.done(claim)
        return claim

    @staticmethod
    def entry_record(value: bytes | None) -> KeyRecord | None:
        """The finished record an entry holds; None for no entry, a tombstone, or
        anything else (a foreign value, an older version: it only costs a read)."""
        if value is None or not value.startswith(_ENTRY):
            return None
        try:
            # An entry is ASCII (written with ensure_ascii): no sniffing of its encoding.
            record = _decode(_JSON.decode(value[1 + _DIGITS :].decode("utf-8", "surrogatepass")))
            if record is None or record.id != int(value[1 : 1 + _DIGITS]):
                return None
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            return None
        return record

    def stale(self, value: bytes | None, claim: Claim) -> bool:
        """Whether an entry read for a claim the primary then answered otherwise is
        of an older row than the primary's (a row evicted without the cache being
        told): then it must go, before it answers a request with its fingerprint."""
        record = self.entry_record(value)
        return record is not None and record.id < claim.record.id

    # -- writing ---------------------------------------------------------------------

    def claimed(self, claim: Claim) -> None:
        """Keep the record of a claim that took the key (EXECUTE) until its lease
        settles: with the two times its finish sets, it is the finished record (see
        `finished`), so that the finish reads nothing back from the primary."""
        if claim.lease is None:
            return
        with self._lock:
            self._claims[_held(claim.lease)] = claim.record
            if len(self._claims) > CLAIMS_KEPT:
                # The oldest: a plain dict's first key is found by walking the slots
                # its deletions left, ever slower at the cap.
                self._claims.popitem(last=False)

    def settled(self, lease: Lease) -> KeyRecord | None:
        """The record of ``lease``'s claim, no longer kept: None when the claim was
        not made through this store (or was dropped, see `CLAIMS_KEPT`)."""
        with self._lock:
            return self._claims.pop(_held(lease), None)

    @staticmethod
    def finished(
        claimed: KeyRecord,
        response: StoredResponse,
        error: str | None,
        finished_at: datetime,
        expires_at: datetime | None,
    ) -> KeyRecord:
        """The row the primary's finish made of the row ``claimed`` (its claim's
        record), given the two times the finish set: what the finish statement
        writes (queries.sql). Between the claim and the finish only a heartbeat
        (``locked_at``, which the finish clears) may change the row: a checkpoint or a
        phase (which also set ``last_run_at``) drop the kept record (the cached
        store's ``checkpoint`` and ``end_phase``), and its finish is then cached by
        its first replay."""
        return replace(
            claimed,
            recovery_point="finished",
            calling=None,
            locked_at=None,
            response=response,
            error=error,
            finished_at=finished_at,
            expires_at=expires_at,
        )

    def entry(self, record: KeyRecord) -> tuple[bytes, int] | None:
        """The entry for a finished ``record`` and its absolute expiry (Unix ms), or
        None if it should not be cached (unfinished, or too close to its expiry)."""
        if record.finished_at is None or record.response is None:
            return None
        ms = self._until_ms(record)
        if ms <= time.time() * 1000:
            return None
        body = json.dumps(_encode(record), separators=(",", ":")).encode()
        return _ENTRY + b"%0*d" % (_DIGITS, record.id) + body, ms

    def _until_ms(self, record: KeyRecord) -> int:
        """When a finished record's entry expires (Unix ms): its ttl after the finish,
        or its key's expiry less the clock skew if that is sooner."""
        if record.finished_at is None:
            return 0  # an unfinished record is never cached: as good as expired
        until = record.finished_at + self._ttl
        if record.expires_at is not None:
            until = min(until, record.expires_at - self._skew)
        return (until - EPOCH) // timedelta(milliseconds=1)

    def tombstone(self, key_id: int) -> tuple[bytes, int]:
        """A tombstone refusing the entries of row ``key_id`` and older, living as
        long as any such entry could (the ttl, plus the clock skew)."""
        until = time.time() + (self._ttl + self._skew).total_seconds()
        return _TOMBSTONE + b"%0*d" % (_DIGITS, key_id + 1), int(until * 1000)

    # -- a degraded cache --------------------------------------------------------------

    def available(self) -> bool:
        """False while a recent failure pauses the cache (counted as skipped)."""
        if self._paused_until and time.monotonic() < self._paused_until:
            self.stats.skipped += 1
            return False
        return True

    def failed(self, operation: str, error: BaseException) -> None:
        """Redis failed and the primary answers alone: count it, pause the cache,
        and log now and then."""
        now = self._trip()
        with self._lock:
            self._unlogged += 1
            if now - self._logged_at < LOG_EVERY:
                return
            count, self._unlogged, self._logged_at = self._unlogged, 0, now
        logger.warning(
            "Redis cache unavailable (%s: %s); %d failure(s) since the last report: "
            "answering from the primary store alone",
            operation,
            error,
            count,
        )

    @staticmethod
    def unreplicated(wait: ReplicaWait, acked: int) -> StoreUnavailable:
        """The error for an eviction's tombstone that fewer than ``wait.replicas``
        replicas acknowledged in time: the master has it (its key's entries are only
        refused, served by the primary), but a failover could lose it."""
        return StoreUnavailable(
            f"the Redis cache's tombstone reached {acked} of the {wait.replicas} "
            f"replica(s) it waits for within {wait.timeout_ms / 1000:g} s, so a failover "
            "could lose it; nothing was evicted, so no cached response can outlive the "
            "key: retry when the replicas are back"
        )

    def refuse(self, error: BaseException) -> StoreUnavailable:
        """The error for a write that must reach Redis (an eviction's tombstone)."""
        # Counted and paused, but not logged: the caller raises this error and reports
        # it, and the warning's "answering from the primary store alone" would be
        # false here; an operator would read two lines, one wrong, for one failure.
        self._trip()
        return StoreUnavailable(
            f"the Redis cache cannot be reached ({error}); nothing was evicted, so no "
            "cached response can outlive the key: retry when Redis is back"
        )

    def _trip(self) -> float:
        """Count a failure and pause the cache; return the time it happened."""
        self._count("error")
        now = time.monotonic()
        self._paused_until = now + self._pause
        return now

    def _count(self, event: str) -> None:
        if event == "hit":
            self.stats.hits += 1
        elif event == "miss":
            self.stats.misses += 1
        else:
            self.stats.errors += 1
        if self._instrumentation is not None:
            self._instrumentation.cache(event)


def _held(lease: Lease) -> tuple[str, str, int, int]:
    # A takeover bumps the token, and a new row has a new id: one lease, one claim.
    return (lease.scope, lease.key, lease.id, lease.token)


# -- the entry's JSON --------------------------------------------------------------------


def _time(value: datetime | None) -> int | None:
    return None if value is None else (value - EPOCH) // MICROSECOND


def _encode(r: KeyRecord) -> dict[str, Any]:
    assert r.response is not None
    return {
        "v": _VERSION,
        "id": r.id,
        "scope": r.scope,
        "key": r.key,
        "method": r.method,
        "path": r.path,
        "fingerprint": r.fingerprint,
        "params": r.params,
        "flow": r.flow,
        "point": r.recovery_point,
        "token": r.lock_token,
        "locked_at": _time(r.locked_at),
        "lock_timeout": r.lock_timeout // MICROSECOND,
        "status": r.response.status,
        "headers": r.response.headers,
        "body": base64.b64encode(r.response.body).decode(),
        "error": r.error,
        "created_at": _time(r.created_at),
        "last_run_at": _time(r.last_run_at),
        "finished_at": _time(r.finished_at),
        "expires_at": _time(r.expires_at),
        "calling": r.calling,
    }


def _decode(d: dict[str, Any]) -> KeyRecord | None:
    # Every replay served from Redis reads one: spelled out, without a call per time.
    if type(d) is not dict or d.get("v") != _VERSION:
        return None
    created, finished = d["created_at"], d["finished_at"]
    if created is None or finished is None:
        return None
    locked, last_run, expires = d["locked_at"], d["last_run_at"], d["expires_at"]
    response = StoredResponse(
        status=int(d["status"]),
        headers=tuple([(str(k), str(v)) for k, v in d["headers"]]),
        # base64.b64decode(validate=True) is this call behind a Python wrapper.
        body=binascii.a2b_base64(d["body"], strict_mode=True),
    )
    return KeyRecord(
        id=int(d["id"]),
        scope=str(d["scope"]),
        key=str(d["key"]),
        method=str(d["method"]),
        path=str(d["path"]),
        fingerprint=str(d["fingerprint"]),
        params=d["params"],
        flow=str(d["flow"]),
        recovery_point=str(d["point"]),
        lock_token=int(d["token"]),
        locked_at=None if locked is None else EPOCH + locked * MICROSECOND,
        lock_timeout=int(d["lock_timeout"]) * MICROSECOND,
        response=response,
        error=d["error"],
        created_at=EPOCH + created * MICROSECOND,
        last_run_at=None if last_run is None else EPOCH + last_run * MICROSECOND,
        finished_at=EPOCH + finished * MICROSECOND,
        expires_at=None if expires is None else EPOCH + expires * MICROSECOND,
        calling=d["calling"],
    )
