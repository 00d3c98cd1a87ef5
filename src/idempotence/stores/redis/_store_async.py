"""The Redis key store on redis-py (DESIGN 8: the fast variant for handler endpoints).

Every operation is one Lua script (``redis.lua``), loaded once and run by EVALSHA; the
outcome of a claim is named by `idempotence.states` from what the script read and wrote,
so P1-P5 are decided in one place. See
[`AsyncRedisStore`][idempotence.stores.redis.AsyncRedisStore] for what it guarantees and
what it cannot.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import suppress
from datetime import datetime
from typing import Any

from ..._concurrency import AsyncBackground, AsyncWakeup
from ...errors import ConfigurationError, StoreError, StoreUnavailable
from ...observability import Instrumentation, combine
from ...states import Claim, ClaimRequest, KeyRecord, KeyStatus, Lease, StoredResponse
from .._fenced import lost as _lost
from .._listener_async import AsyncListener
from .._listener_shared import STOP_CHECK
from .._redis_url import sentinel_url
from .._waiters import Waiters
from ..capabilities import Capability
from ._clients import (
    client_kinds,
    client_options,
    close_async,
    cluster_url,
    no_retry_async,
    open_client,
    open_sentinel,
)
from ._clients import pubsub as make_pubsub
from ._lane_async import AsyncLane
from ._replicas import ReplicaWait, from_url, url_options
from ._store_shared import (
    DEFAULT_PREFIX,
    DEFAULT_TIMEOUT,
    SCRIPTS,
    AsyncRedis,
    AsyncRedisCluster,
    AsyncSentinel,
    NoScriptError,
    RedisError,
    channel,
    check_prefix,
    claim_call,
    decimal,
    decode,
    encode,
    encoded_record_key,
    finish_args,
    record,
    record_pattern,
    reraise,
    status_result,
    timestamp,
    translated,
)
from ._store_shared import claim_result as _claim_result

AsyncClient = AsyncRedis | AsyncRedisCluster

_KEPT_KEYS = 4096
"""At most this many leases' Redis keys are kept for their writes (see
`AsyncRedisStore._kept`); past it the store forgets them all and computes again."""


class _AsyncRedisListener(AsyncListener):
    """P10: the store's one subscription to its channel, read by a background job;
    the waiting itself is `AsyncListener`'s (see `_listener_shared`)."""

    backend = "Redis"

    def __init__(self, client: AsyncClient, settled: bytes) -> None:
        # Not the PostgreSQL listener's connection settings: only its waiting.
        self.waiters = Waiters(AsyncWakeup.set)
        self._reader = AsyncBackground("idempotence-redis-listener")
        self._client = client
        self._channel = settled
        self._closed = False
        self._healthy = True

    async def _read_async(self, ready: Callable[[bool], None]) -> None:
        pubsub: Any = None
        try:
            pubsub = make_pubsub(self._client)
            await pubsub.subscribe(self._channel)
            self._connected()
            ready(True)
            while not self._reader.stopping:
                message = await pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=STOP_CHECK
                )
                if message is not None and message.get("type") == "message":
                    self.waiters.notify(decode(message["data"]))
        except (RedisError, OSError) as exc:
            self._failed(exc)
        finally:
            ready(False)  # if it never came up
            if pubsub is not None:
                with suppress(RedisError, OSError):
                    await close_async(pubsub)  # a dead connection is closed already


class AsyncRedisStore:
    """The Redis key store: a [`AsyncKeyStore`][idempotence.stores.redis.AsyncKeyStore]
    (P1-P5, F1, F2, P10).

    ``target`` is a ``redis://`` / ``rediss://`` URL (``redis+cluster://host:port``
    for a Redis Cluster, ``redis+sentinel://host:port[,host:port...]/service[/db]``
    for the master that Redis Sentinel names, found again after a failover), for
    which the store opens and owns a client with connect and read timeouts of
    ``timeout`` seconds, or a redis-py client of the application's,
    ``Redis`` or ``RedisCluster`` (the asyncio ones for the async store), which must
    not decode responses. Every Redis key starts with ``prefix`` and holds the scope and
    the key (tenants never share a key), behind a hash tag: one record, one hash, one
    cluster slot.

    What it guarantees: a claim is one atomic script, its outcome the SQL stores'
    (mismatch first, then replay, in progress with ``retry_after``, execute or take over
    with the next token); finish, release, heartbeat and forget are fenced by the
    record's id and token (a zombie's write raises
    [`LockLost`][idempotence.maintenance.completer_async.LockLost]); every time is the
    server's (``TIME``); a finished record expires with its retention (its TTL), a
    locked one never while its lock is live; an unreachable server raises
    [`StoreUnavailable`][idempotence.errors.StoreUnavailable] within about ``timeout``
    (the HTTP middleware answers 503 and runs nothing).

    ``replicas=N`` makes every write wait until N replicas have it (Redis ``WAIT``, in
    the same round trip), at most ``replica_timeout`` seconds (half of ``timeout`` by
    default): a write fewer replicas acknowledged raises
    [`StoreUnavailable`][idempotence.errors.StoreUnavailable] instead of reporting
    success, and a replay is answered only once the finish it replays is on N replicas.
    So a failover to a replica (Sentinel promotes the most up-to-date one) loses no
    lock and no finish the store reported. The URL may say it instead:
    ``?replicas=1&replica_timeout=0.5``. Not on a Redis Cluster.

    What it cannot do:

    * share a transaction with the application's writes: no request-as-transaction
      (F3), no flows with atomic phases; the HTTP configuration refuses them;
    * be more durable than the server: with ``appendonly no`` a restart loses every
      record, with AOF ``everysec`` about a second of them, and without ``replicas``
      a failover to a replica can lose writes already acknowledged. A lost record is a new key: a
      retry then executes again. A lost lock is a free key, so its twin may execute
      while the first worker still runs (whose fenced finish is then refused);
    * store a 408 for an abandoned key: an unfinished record past its retention just
      expires (the SQL reaper stores a failure first), so a retry after that executes.

    A crash after a side effect leaves the record locked: a retry gets 409 until the
    lock times out, then takes the key over with the next token and runs again (a
    handler's side effects need their own idempotency key, derived from ours), and the
    crashed worker, if it comes back, cannot write.

    ```python
    store = AsyncRedisStore("redis://127.0.0.1:6379/0")
    await store.claim(ClaimRequest(scope="acct_1", key="k1", fingerprint=fp))
    ```
    """

    capabilities = frozenset({Capability.WAITING, Capability.LISTENING})
    """Waiting twins are woken by pub/sub (P10); no transaction is shared with the
    application (no F3, no atomic phases): every operation is one script."""

    def __init__(
        self,
        target: str | AsyncClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = DEFAULT_TIMEOUT,
        replicas: int = 0,
        replica_timeout: float | None = None,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        self._prefix = check_prefix(prefix)
        self._prefix_bytes = encode(prefix)
        self._client: AsyncClient
        if isinstance(target, str):
            # No retry of a failed command (see no_retry_async); a cluster client still
            # follows MOVED and ASK redirections, which are not failures.
            options = client_options(timeout) | {"retry": no_retry_async()}
            target, ours = url_options(target)
            replicas, replica_timeout = from_url(ours, replicas, replica_timeout)
            self._wait = ReplicaWait.of(replicas, replica_timeout, timeout)
            cluster = cluster_url(target)
            self._lane: AsyncLane | None = None
            sentinel = sentinel_url(target)
            if cluster is not None:
                self._refuse_cluster()
                self._client = open_client(AsyncRedisCluster, cluster, options)
            elif sentinel is not None:
                # The master the sentinels name, asked again after a failover. Not
                # through the lane: its one connection would stay on a demoted master.
                self._client = open_sentinel(AsyncSentinel, sentinel, options)
            else:
                client: AsyncRedis = open_client(AsyncRedis, target, options)
                self._client = client
                # The scripts go past the client's per-command machinery (see
                # _lane_async); a cluster's client routes them by slot. Not when
                # writes wait for replicas: a WAIT holds its connection, and the lane's
                # one connection carries every request's commands.
                self._lane = None if self._wait.replicas else AsyncLane.of(client)
            self._owned = True
        else:
            if not isinstance(target, AsyncRedis | AsyncRedisCluster):
                raise ConfigurationError(
                    f"{type(self).__name__} needs a redis:// URL or a client of "
                    f"{client_kinds(AsyncRedis, AsyncRedisCluster)}, not {type(target).__name__}"
                )
            if target.get_encoder().decode_responses:
                raise ConfigurationError(
                    "the Redis store needs a client with decode_responses=False"
                )
            self._wait = ReplicaWait.of(replicas, replica_timeout, None)
            if isinstance(target, AsyncRedisCluster):
                self._refuse_cluster()
            self._client, self._owned, self._lane = target, False, None
        self._channel = channel(prefix)
        self._scripts = {name: self._client.register_script(s) for name, s in SCRIPTS.items()}
        self._instrumentation = combine(instrumentation)
        self._listener = _AsyncRedisListener(self._client, self._channel)
        #: Each live lease's (scope, key, Redis key), by record id (see _kept).
        self._keys: dict[int, tuple[str, str, bytes]] = {}
        self._closed = False

    def _refuse_cluster(self) -> None:
        if self._wait.replicas:
            raise ConfigurationError(
                "replicas= is not supported on a Redis Cluster: its WAIT answers for one "
                "node's connection only; use a plain server or a Sentinel master"
            )

    @property
    def client(self) -> AsyncClient:
        """The redis-py client the store runs on."""
        return self._client

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def instrumentation(self) -> Instrumentation | None:
        return self._instrumentation

    def record_key(self, scope: str, key: str) -> bytes:
        """The Redis key of ``(scope, key)``'s record."""
        return encoded_record_key(self._prefix_bytes, scope, key)

    async def _run(self, name: str, keys: list[bytes], args: list[Any]) -> Any:
        """Run script ``name``; with ``replicas``, a write that too few replicas
        acknowledged raises StoreUnavailable (see `_replicas`)."""
        if self._wait.replicas:
            reply, acked = await self._run_waited(name, keys, args)
            if acked < self._wait.replicas:
                raise self._wait.refused(name, acked)
            return reply
        return await self._send(name, keys, args)

    def _send(self, name: str, keys: list[bytes], args: list[Any]) -> Awaitable[Any]:
        """Run script ``name`` alone, with no wait for replicas: the lane's own call,
        which raises the library's errors itself (no coroutine of the store's around
        each of a request's scripts)."""
        if self._closed:
            raise StoreUnavailable("the Redis key store is closed")
        if self._lane is not None:
            return self._lane.evalsha(self._scripts[name], keys, args, True)
        return self._send_by_client(name, keys, args)

    async def _send_by_client(self, name: str, keys: list[bytes], args: list[Any]) -> Any:
        """`_send` without a lane (no hiredis): through redis-py's client."""
        try:
            return await self._scripts[name](keys=keys, args=args)
        except Exception as exc:
            reraise(exc)

    async def _run_waited(self, name: str, keys: list[bytes], args: list[Any]) -> tuple[Any, int]:
        """Run script ``name`` and then ``WAIT``, in one round trip on one connection
        (WAIT counts the replicas that have that connection's writes); the script's
        reply and how many replicas acknowledged it."""
        self._check_open()
        script = self._scripts[name]
        client: Any = self._client  # a plain server's (a cluster is refused)
        with translated():
            for _ in range(2):
                async with client.pipeline(transaction=False) as pipe:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                    pipe.wait(self._wait.replicas, self._wait.timeout_ms)
                    reply, acked = await pipe.execute(raise_on_error=False)
                if isinstance(reply, NoScriptError):  # a restarted server: load it, again
                    await client.script_load(script.script)
                    continue
                for answer in (reply, acked):
                    if isinstance(answer, Exception):
                        raise answer
                return reply, int(acked)
            raise StoreError(f"the Redis server did not keep the {name} script loaded")

    async def claim(self, request: ClaimRequest) -> Claim:
        """Claim ``request``'s key in one atomic script; return its single outcome."""
        if self._instrumentation is None and not self._wait.replicas:
            # Every request's first script: no coroutine between it and the send.
            key, args, record_id = claim_call(self._prefix_bytes, request)
            reply = await self._send("claim", [key], args)
            return self._kept(_claim_result(request, record_id, args, reply), key)
        if self._instrumentation is not None:
            with self._instrumentation.claim(request) as watch:
                return watch.done(await self._claim(request))
        return await self._claim(request)

    async def _claim(self, request: ClaimRequest) -> Claim:
        if not self._wait.replicas:
            key, args, record_id = claim_call(self._prefix_bytes, request)
            reply = await self._send("claim", [key], args)
            return self._kept(_claim_result(request, record_id, args, reply), key)
        key, args, record_id = claim_call(self._prefix_bytes, request, replicated=True)
        reply, acked = await self._run_waited("claim", [key], args)
        claim = _claim_result(request, record_id, args, reply)
        if acked < self._wait.replicas:
            if claim.lease is not None:
                # The master holds the lock, which the replicas may never see: nobody
                # runs under it, so free it now rather than leave retries a 409 until
                # it lapses (a release that fails leaves that).
                with suppress(StoreError):
                    lease = claim.lease
                    await self._send("release", [key], [lease.id, lease.token, self._channel])
            raise self._wait.refused("claim", acked)
        return self._kept(claim, key)

    def _kept(self, claim: Claim, key: bytes) -> Claim:
        """``claim``, the Redis key it computed kept for its lease's writes (a digest
        and a format less each), until the lease's last: finish, release or forget."""
        lease = claim.lease
        if lease is not None:
            kept = self._keys
            if len(kept) >= _KEPT_KEYS:
                kept.clear()  # leases never settled here (their app stopped waiting): forget
            kept[lease.id] = (lease.scope, lease.key, key)
        return claim

    async def _fenced(self, operation: str, lease: Lease, args: list[Any]) -> Any:
        """Run a fenced script (F1); a refusal (a falsy reply) raises LockLost."""
        # The key its claim computed, if this store made it; the heartbeat keeps it
        # for the lease's last write. The id is the record's incarnation (F1), the
        # scope and key are checked all the same: never another record's key.
        if operation == "heartbeat":
            kept = self._keys.get(lease.id)
        else:
            kept = self._keys.pop(lease.id, None)
        if kept is not None and kept[0] == lease.scope and kept[1] == lease.key:
            keys = [kept[2]]
        else:
            keys = [encoded_record_key(self._prefix_bytes, lease.scope, lease.key)]
        args = [b"%d" % lease.id, decimal(lease.token), *args]
        reply = await (
            self._run(operation, keys, args)
            if self._wait.replicas
            else self._send(operation, keys, args)
        )
        if not reply:
            lost = _lost(lease, operation)
            if self._instrumentation is not None:
                self._instrumentation.lock_lost(operation, lost)
            raise lost
        return reply

    async def finish(
        self, lease: Lease, response: StoredResponse, *, error: str | None = None
    ) -> None:
        """Store ``response`` and unlock, fenced; ``error`` marks the key errored (R6)."""
        await self._fenced("finish", lease, finish_args(response, error, self._channel))

    async def release(self, lease: Lease) -> None:
        """Unlock without finishing, fenced: the next claim resumes (R5)."""
        await self._fenced("release", lease, [self._channel])

    async def heartbeat(self, lease: Lease) -> datetime:
        """Extend the lock by its timeout from now, fenced (F2); the new ``locked_at``."""
        return timestamp(await self._fenced("heartbeat", lease, []))

    async def forget(self, lease: Lease) -> None:
        """Delete a key still at ``started``, fenced: a rejected request stores nothing."""
        await self._fenced("forget", lease, [self._channel])

    async def get(self, scope: str, key: str) -> KeyRecord | None:
        """The key's current record, or None."""
        self._check_open()
        with translated():
            fields = await self._client.hgetall(self.record_key(scope, key))
        return record(fields) if fields else None

    async def key_status(self, scope: str, key: str) -> KeyStatus | None:
        """The key's state on the server's clock, with its times and its stored status
        code (never its body); None for a key the store does not hold. A finished key
        expires with its retention (its TTL), so past it the store holds nothing and
        this is None: on Redis the expiry itself is the reaper."""
        return status_result(await self._run("status", [self.record_key(scope, key)], []))

    async def evict(self, scope: str, key: str, *, force: bool = False) -> bool | None:
        """Delete a key's record unless a live lock holds it (``force`` deletes it
        anyway): True deleted, False refused, None when there is no such key."""
        reply = await self._run("evict", [self.record_key(scope, key)], ["1" if force else "0"])
        return None if reply == -1 else bool(reply)

    async def records(self, scope: str | None = None) -> list[KeyRecord]:
        """Every record of ``scope`` (of every scope when None), found by SCAN (never
        KEYS, which blocks the server): the operator's listing (F5). A record that
        expires during the scan is left out."""
        self._check_open()
        found, seen = [], set()
        with translated():
            async for name in self._client.scan_iter(
                match=record_pattern(self._prefix, scope), count=1000
            ):
                if name in seen:
                    continue  # SCAN may return a key twice (while Redis resizes its table)
                seen.add(name)
                fields = await self._client.hgetall(name)
                if not fields:
                    continue
                # A brace in another scope can make the pattern match it: check.
                got = record(fields)
                if scope is None or got.scope == scope:
                    found.append(got)
        return found

    async def migrate(self) -> list[str]:
        """Nothing to migrate: a Redis store has no schema. Returns ``[]``, so code
        that migrates whatever [`open_store`][idempotence.database.open_store] opened works."""
        return []

    async def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        """P10: return as soon as the channel says the key settled, or after
        ``seconds`` (the bounded fallback when no message comes). Never raises for a
        store failure: the next claim reports it."""
        await self._listener.wait(scope, key, seconds, lambda: self._mark(scope, key))

    async def _mark(self, scope: str, key: str) -> bool:
        # A hint for the twin's wake-up, not state to keep: no wait for replicas.
        return bool(await self._send("mark_waiter", [self.record_key(scope, key)], []))

    async def server_time(self) -> datetime:
        """The server's clock (``TIME``)."""
        self._check_open()
        with translated():
            seconds, micros = await self._client.time()
        return timestamp(seconds * 1_000_000 + micros)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("the Redis key store is closed")

    async def close(self) -> None:
        """Stop the listener and close the client the store opened (an application's
        client stays open); every later operation raises StoreUnavailable."""
        if self._closed:
            return
        self._closed = True
        await self._listener.close()
        if self._owned:
            try:
                if self._lane is not None:
                    await self._lane.close()
                await close_async(self._client)
            except (RedisError, OSError) as exc:
                raise StoreError(f"closing the Redis client failed: {exc}") from exc

    async def __aenter__(self) -> AsyncRedisStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
