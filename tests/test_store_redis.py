"""The Redis key store (DESIGN 8): what the conformance suite cannot say about it.

Against the machine's real Redis under a key prefix of each test's own (deleted
afterwards), or a ``redis-server`` of the test's own where a test stops one, and a
real three-node Redis Cluster for the hash tags. The P1-P5 and F1/F2 basics run in
the conformance suite (tests/test_store_conformance.py), sync and async.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import signal
import struct
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
import redis.cluster

from idempotence import (
    Claim,
    ClaimRequest,
    ConfigurationError,
    DatabaseUrl,
    KeyState,
    LockLost,
    Outcome,
    StoredResponse,
    StoreError,
    StoreUnavailable,
    open_async_store,
    open_store,
)
from idempotence.database import open_sql_store
from idempotence.flows import Flow
from idempotence.http import Endpoint, Idempotency, Policy, single_tenant
from idempotence.stores.redis import AsyncRedisStore, RedisStore, record_key
from idempotence.stores.redis import _headers as _redis_headers
from idempotence.stores.redis import _store_shared as _redis_base
from tests.support.clock import app_clock_ahead
from tests.support.polling import eventually
from tests.support.redis import SHARED_URL, delete_prefix, redis_cluster, redis_server, require
from tests.support.stores import Blocking, EventLoopThread

FP = "f" * 64
SHORT = timedelta(milliseconds=300)


def request(scope: str, key: str = "k1", **kw: Any) -> ClaimRequest:
    kw.setdefault("fingerprint", FP)
    return ClaimRequest(scope=scope, key=key, **kw)


def response(n: int = 1) -> StoredResponse:
    return StoredResponse.of(201, {"content-type": "application/json"}, f'{{"n": {n}}}')


@pytest.fixture(params=["sync", "async"])
def redis_store(
    request: pytest.FixtureRequest, redis_prefix: str, loop_thread: EventLoopThread
) -> Iterator[Any]:
    """A Redis store on the shared server, with a sync face whatever its flavour."""
    url = require(SHARED_URL)
    if request.param == "sync":
        face: Any = RedisStore(url, prefix=redis_prefix)
    else:
        face = Blocking(AsyncRedisStore(url, prefix=redis_prefix), loop_thread)  # type: ignore[arg-type]
    try:
        yield face
    finally:
        face.close()


def raw(store: Any) -> Any:
    """The store itself behind a :class:`Blocking` face."""
    return store.store if isinstance(store, Blocking) else store


def sync_client(store: Any) -> redis.Redis:
    return redis.Redis.from_url(SHARED_URL)


# -- P6: one execution per key, however many claim it at once ----------------------------


@pytest.mark.slow
def test_p6_32_concurrent_claims_of_200_keys_execute_each_once(
    redis_prefix: str, scope: str
) -> None:
    keys = [f"key-{n}" for n in range(200)]
    store = RedisStore(require(SHARED_URL), prefix=redis_prefix)
    executions: Counter[str] = Counter()
    barrier = threading.Barrier(32)

    def worker() -> list[Outcome]:
        barrier.wait()
        outcomes = []
        for key in keys:
            claim = store.claim(request(scope, key))
            outcomes.append(claim.outcome)
            if claim.outcome is Outcome.EXECUTE:
                executions[key] += 1
        return outcomes

    try:
        with ThreadPoolExecutor(32) as pool:
            results = [f.result() for f in [pool.submit(worker) for _ in range(32)]]
    finally:
        store.close()
    assert executions == Counter({key: 1 for key in keys})
    seen = Counter(outcome for outcomes in results for outcome in outcomes)
    assert seen == {Outcome.EXECUTE: 200, Outcome.IN_PROGRESS: 31 * 200}


@pytest.mark.slow
def test_p6_32_concurrent_async_claims_of_200_keys_execute_each_once(
    redis_prefix: str, scope: str
) -> None:
    async def main() -> Counter[Outcome]:
        store = AsyncRedisStore(require(SHARED_URL), prefix=redis_prefix)
        seen: Counter[Outcome] = Counter()
        try:
            for n in range(200):
                claims = await asyncio.gather(
                    *(store.claim(request(scope, f"key-{n}")) for _ in range(32))
                )
                outcomes = Counter(claim.outcome for claim in claims)
                assert outcomes[Outcome.EXECUTE] == 1, (n, outcomes)
                seen.update(outcomes)
        finally:
            await store.close()
        return seen

    assert asyncio.run(main()) == {Outcome.EXECUTE: 200, Outcome.IN_PROGRESS: 31 * 200}


# -- F1: fencing ---------------------------------------------------------------------------


def test_f1_a_zombie_can_neither_finish_release_heartbeat_nor_forget(
    redis_store: Any, scope: str
) -> None:
    zombie = redis_store.claim(request(scope, lock_timeout=SHORT)).lease
    time.sleep(SHORT.total_seconds() + 0.1)  # a GC pause: the lock expires
    taker = redis_store.claim(request(scope)).lease
    assert taker.token == zombie.token + 1
    with pytest.raises(LockLost):
        redis_store.finish(zombie, response(666))
    for fenced in (redis_store.release, redis_store.heartbeat, redis_store.forget):
        with pytest.raises(LockLost):
            fenced(zombie)
    record = redis_store.get(scope, "k1")
    assert (record.lock_token, record.finished_at, record.response) == (2, None, None)
    assert record.locked_at is not None  # the taker still holds it
    redis_store.finish(taker, response(2))
    replay = redis_store.claim(request(scope))
    assert (replay.outcome, replay.response) == (Outcome.REPLAY, response(2))


def test_f1_a_lease_of_a_forgotten_key_cannot_write_to_its_next_incarnation(
    redis_store: Any, scope: str
) -> None:
    """The next claim of a forgotten (or expired, or evicted) key starts at token 1
    again: the record's random id tells the incarnations apart."""
    old = redis_store.claim(request(scope)).lease
    redis_store.forget(old)
    new = redis_store.claim(request(scope)).lease
    assert (new.token, old.token) == (1, 1) and new.id != old.id
    with pytest.raises(LockLost):
        redis_store.finish(old, response(666))
    with pytest.raises(LockLost):
        redis_store.release(old)
    assert redis_store.get(scope, "k1").locked_at is not None
    redis_store.finish(new, response(1))
    assert redis_store.claim(request(scope)).response == response(1)


def test_f1_a_lease_naming_another_key_never_writes_the_record_whose_key_was_kept(
    redis_store: Any, scope: str
) -> None:
    """The store keeps the Redis key each claim computed, by record id, for that
    lease's writes: a lease with the same id and token but another key (or scope)
    must write to its own key (none there: LockLost), never to the kept one's record;
    and the real lease still finishes after a heartbeat, which keeps the key."""
    from dataclasses import replace

    lease = redis_store.claim(request(scope)).lease
    for forged in (replace(lease, key="k2"), replace(lease, scope=scope + "-other")):
        with pytest.raises(LockLost):
            redis_store.finish(forged, response(666))
    assert redis_store.get(scope, "k1").finished_at is None
    redis_store.heartbeat(lease)
    redis_store.finish(lease, response(1))
    assert redis_store.claim(request(scope)).response == response(1)
    assert not raw(redis_store)._keys  # the lease's last write let its key go


def test_forget_refuses_a_key_past_started(redis_store: Any, scope: str) -> None:
    lease = redis_store.claim(request(scope)).lease
    redis_store.finish(lease, response())
    with pytest.raises(LockLost):
        redis_store.forget(lease)
    assert redis_store.claim(request(scope)).outcome is Outcome.REPLAY


def test_p5_a_released_key_is_taken_over_with_the_next_token(redis_store: Any, scope: str) -> None:
    first = redis_store.claim(request(scope)).lease
    redis_store.release(first)
    claim = redis_store.claim(request(scope, lock_timeout=timedelta(seconds=7)))
    assert claim.outcome is Outcome.EXECUTE and claim.took_over
    assert claim.lease.token == 2 and claim.lease.id == first.id
    assert claim.record.lock_timeout == timedelta(seconds=7)  # the new claim's own
    with pytest.raises(LockLost):
        redis_store.finish(first, response(666))


# -- times, expiry ---------------------------------------------------------------------------


def test_times_are_the_servers_clock(redis_store: Any, scope: str) -> None:
    before = raw_time()
    record = redis_store.claim(request(scope)).record
    after = raw_time()
    assert before <= record.created_at <= after
    assert record.locked_at == record.created_at == record.last_run_at
    assert record.expires_at - record.created_at == timedelta(hours=24)


def test_a_client_whose_clock_is_wrong_changes_no_time(
    redis_store: Any, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The app server's clock an hour ahead, as time.time and as the store module's
    # datetime.now: the record's times, its lock and its expiry still follow the
    # server's (a client's clock would make every lock an hour old at once).
    ahead = timedelta(hours=1)
    real_time, real_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() + ahead.total_seconds())
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + int(ahead.total_seconds() * 1e9))

    class Ahead(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) + ahead

    monkeypatch.setattr(_redis_base, "datetime", Ahead)
    before = raw_time()
    record = redis_store.claim(request(scope, lock_timeout=timedelta(minutes=10))).record
    after = raw_time()
    assert before <= record.created_at <= after
    assert redis_store.claim(request(scope)).outcome is Outcome.IN_PROGRESS
    assert 0 < ttl_ms(redis_store, scope) <= 24 * 3600 * 1000 + 1


def raw_time() -> Any:
    from datetime import UTC, datetime

    with redis.Redis.from_url(SHARED_URL) as client:
        seconds, micros = client.time()
    return datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=micros)


def ttl_ms(store: Any, scope: str, key: str = "k1") -> int:
    """The record's PTTL. The expiry is the server's microseconds rounded UP to a
    millisecond (redis.lua: set_expiry) and PTTL counts from the millisecond before,
    so it reads up to 1 ms over the retention just after the write."""
    with redis.Redis.from_url(SHARED_URL) as client:
        return int(client.pttl(raw(store).record_key(scope, key)))


def test_a_finished_key_expires_with_its_retention(redis_store: Any, scope: str) -> None:
    lease = redis_store.claim(request(scope, retention=timedelta(milliseconds=700))).lease
    redis_store.finish(lease, response())
    assert 0 < ttl_ms(redis_store, scope) <= 700 + 1
    assert redis_store.claim(request(scope)).outcome is Outcome.REPLAY
    time.sleep(0.9)
    assert redis_store.get(scope, "k1") is None
    # Expired: the key is new again (the SQL stores' reaper deletes it likewise).
    claim = redis_store.claim(request(scope))
    assert (claim.outcome, claim.lease.token) == (Outcome.EXECUTE, 1)


def test_a_key_status_follows_the_ttl_on_the_servers_clock(
    redis_store: Any, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client's clock two hours ahead: a key with an hour of retention is still
    # complete by the server's clock, which names its status.
    app_clock_ahead(monkeypatch, timedelta(hours=2), _redis_base)
    before = raw_time()
    lease = redis_store.claim(request(scope, retention=timedelta(hours=1))).lease
    redis_store.finish(lease, response())
    status = redis_store.key_status(scope, "k1")
    assert (status.state, status.response_status) == (KeyState.COMPLETE, 201)
    assert before <= status.now <= raw_time()
    # A key whose retention ends is gone with its TTL: unknown, and new again. Redis's
    # expiry is the reaper here, so the status never lingers at EXPIRED.
    lease = redis_store.claim(request(scope, "k2", retention=timedelta(milliseconds=300))).lease
    redis_store.finish(lease, response())
    assert redis_store.key_status(scope, "k2").state is KeyState.COMPLETE
    eventually(lambda: redis_store.key_status(scope, "k2") is None, "the record expired")
    assert redis_store.claim(request(scope, "k2")).outcome is Outcome.EXECUTE


def test_a_locked_key_never_expires_while_its_lock_is_live(redis_store: Any, scope: str) -> None:
    lease = redis_store.claim(
        request(scope, retention=timedelta(milliseconds=200), lock_timeout=timedelta(seconds=1))
    ).lease
    assert ttl_ms(redis_store, scope) > 900  # the lock's end, not the retention's
    for _ in range(3):  # beaten past the retention and the first lock timeout
        time.sleep(0.5)
        redis_store.heartbeat(lease)
        assert ttl_ms(redis_store, scope) > 900
    assert redis_store.claim(request(scope)).outcome is Outcome.IN_PROGRESS
    redis_store.finish(lease, response())
    assert redis_store.claim(request(scope)).outcome is Outcome.REPLAY
    assert 0 < ttl_ms(redis_store, scope) <= 200 + 1


def test_a_taken_over_key_lives_until_its_new_lock_ends(redis_store: Any, scope: str) -> None:
    short = {"retention": timedelta(milliseconds=300), "lock_timeout": timedelta(milliseconds=300)}
    redis_store.release(redis_store.claim(request(scope, **short)).lease)
    # The takeover's lock (2 s) outlasts the first claim's retention and lock (the
    # sleep below passes both): the record must outlast them too, or a twin would
    # find the key new and run it again.
    lease = redis_store.claim(request(scope, lock_timeout=timedelta(seconds=2))).lease
    assert lease.token == 2
    assert ttl_ms(redis_store, scope) > 1500
    time.sleep(0.5)
    record = redis_store.get(scope, "k1")
    assert record is not None and record.lock_token == 2
    assert redis_store.claim(request(scope)).outcome is Outcome.IN_PROGRESS
    redis_store.finish(lease, response())
    assert redis_store.claim(request(scope)).outcome is Outcome.REPLAY


def test_retention_none_sets_no_ttl(redis_store: Any, scope: str) -> None:
    lease = redis_store.claim(request(scope, retention=None)).lease
    assert ttl_ms(redis_store, scope) == -1  # kept forever (a ledger), locked or not
    redis_store.finish(lease, response())
    assert ttl_ms(redis_store, scope) == -1


def test_a_finish_writes_exactly_the_finished_fields(redis_store: Any, scope: str) -> None:
    """The finish script's one HMGET, HSET and HDEL (redis.lua): the response and the
    times in, the lock, the call in flight and the waiting flag out, the retention
    counted from the finish, and a marked waiter woken (P10)."""
    lease = redis_store.claim(request(scope, retention=timedelta(hours=1))).lease
    client = sync_client(redis_store)
    name = raw(redis_store).record_key(scope, "k1")
    client.hset(name, mapping={"calling": "charge", "waiting": "1"})
    with client.pubsub() as pubsub:
        pubsub.subscribe(raw(redis_store)._channel)
        redis_store.finish(lease, response(7), error="boom")
        messages = [pubsub.get_message(timeout=1) for _ in range(2)]
    fields = {k.decode(): v for k, v in client.hgetall(name).items()}
    client.close()
    assert {"locked", "calling", "waiting"}.isdisjoint(fields)
    assert (fields["rp"], fields["status"], fields["error"]) == (b"finished", b"201", b"boom")
    assert int(fields["expires"]) == int(fields["finished"]) + 3_600_000_000
    assert 3_599_000 < ttl_ms(redis_store, scope) <= 3_600_001
    assert [m["data"] for m in messages if m and m["type"] == "message"] == [
        b'["%s","k1"]' % scope.encode()
    ]
    record = redis_store.get(scope, "k1")
    assert record.error == "boom" and record.locked_at is None and record.calling is None


@pytest.mark.parametrize("waiter", [True, False], ids=["waiter", "no-waiter"])
def test_a_release_unlocks_wakes_and_shortens_the_ttl_to_the_retention(
    redis_store: Any, scope: str, waiter: bool
) -> None:
    """The release script's one HMGET (redis.lua): the lock and the waiting flag out, a
    marked waiter woken (P10), and the TTL, held out to the lock's end while it was
    locked, back to the retention's end (B3)."""
    claimed = request(scope, retention=timedelta(hours=1), lock_timeout=timedelta(hours=2))
    lease = redis_store.claim(claimed).lease
    assert ttl_ms(redis_store, scope) > 7_100_000  # the lock's end, not the retention's
    client = sync_client(redis_store)
    name = raw(redis_store).record_key(scope, "k1")
    if waiter:
        client.hset(name, "waiting", "1")
    with client.pubsub() as pubsub:
        pubsub.subscribe(raw(redis_store)._channel)
        redis_store.release(lease)
        messages = [pubsub.get_message(timeout=1) for _ in range(2)]
    fields = {k.decode(): v for k, v in client.hgetall(name).items()}
    client.close()
    assert {"locked", "waiting"}.isdisjoint(fields)
    assert fields["rp"] == b"started" and fields["token"] == b"1"
    assert 3_590_000 < ttl_ms(redis_store, scope) <= 3_600_001
    woken = [b'["%s","k1"]' % scope.encode()] if waiter else []
    assert [m["data"] for m in messages if m and m["type"] == "message"] == woken
    # The next claim resumes it, with the next token (F1).
    again = redis_store.claim(claimed)
    assert (again.outcome, again.lease.token) == (Outcome.EXECUTE, 2)


# -- tenants and hostile keys --------------------------------------------------------------


def test_scope_is_part_of_every_redis_key(redis_store: Any, redis_prefix: str, scope: str) -> None:
    # A scope that ends where another's key begins must not meet it.
    pairs = [(scope, "1:x"), (scope + ":1", "x"), (scope + ":1:x", ""), (scope + "{", "}")]
    for n, (s, k) in enumerate(pairs):
        claim = redis_store.claim(request(s, k or "-", params={"n": n}))
        assert claim.outcome is Outcome.EXECUTE
        name = raw(redis_store).record_key(s, k or "-")
        assert s.encode() in name and name.startswith(redis_prefix.encode() + b":{")
    for n, (s, k) in enumerate(pairs):
        assert redis_store.get(s, k or "-").params == {"n": n}
    assert [r.key for r in raw_records(redis_store, scope)] == ["1:x"]
    assert raw_records(redis_store, scope + "{")[0].key == "}"


def raw_records(store: Any, scope: str) -> list[Any]:
    found = raw(store).records(scope)
    return store._run(found) if isinstance(store, Blocking) else found


HOSTILE = [
    "{",
    "}",
    "{}",
    "}{",
    "{a}{b}",
    "x" * 10_000,
    "{" * 5_000 + "}" * 5_000,
    "".join(chr(n) for n in range(1, 256)),
    "\x00nul\x00",
    "caf\u00e9 \u2603 \U0001f600",
    "*?[]\\ glob",
    "\ud800 lone surrogate",
]


@pytest.mark.parametrize("retention", [None, timedelta(days=1), timedelta(microseconds=1_234_567)])
def test_a_new_keys_claim_returns_the_record_as_stored(
    redis_store: Any, scope: str, retention: timedelta | None
) -> None:
    """A new key's claim does not read its record back (the script answers the time
    only): the record the store rebuilds from the request is the one it wrote."""
    params = {"pair": (1, 2), "text": "caf\u00e9", "n": 1.5, "none": None}
    new = request(
        scope,
        method="PUT",
        path="/v1/charges/{id}",
        params=params,
        flow="charge",
        lock_timeout=timedelta(seconds=7, microseconds=3),
        retention=retention,
    )
    claim = redis_store.claim(new)
    assert claim.outcome is Outcome.EXECUTE
    stored = redis_store.get(scope, "k1")
    assert claim.record == stored
    assert stored.params == {"pair": [1, 2], "text": "caf\u00e9", "n": 1.5, "none": None}
    assert (stored.expires_at is None) == (retention is None)
    # A takeover reads the record back (the script's other branch): the same fields.
    redis_store.release(claim.lease)
    again = redis_store.claim(new)
    assert again.record == redis_store.get(scope, "k1")
    assert again.record.lock_token == 2 and again.record.id == stored.id
    # A replay reads the values of READ_FIELDS back: the record HGETALL gives.
    redis_store.finish(again.lease, response())
    replay = redis_store.claim(new)
    assert replay.outcome is Outcome.REPLAY
    assert replay.record == redis_store.get(scope, "k1")
    assert replay.record.response == response()


def test_the_scripts_read_the_fields_that_python_names() -> None:
    """READ_FIELDS in redis.lua and in redis/_store_shared.py: one list, in one order."""
    from importlib import resources

    lua = resources.files("idempotence").joinpath("stores", "redis", "redis.lua").read_text()
    table = lua[lua.index("local READ_FIELDS = {") : lua.index("}", lua.index("READ_FIELDS"))]
    names = tuple(re.findall(r"'([a-z_]+)'", table))
    assert names == tuple(name.decode() for name in _redis_base.READ_FIELDS)
    # read() spells the list's size out twice, for speed: its lengths' table of -1 and
    # struct.pack's format, one i4 per field.
    body = lua[lua.index("local function read(k)") : lua.index("\nend\n", lua.index("read(k)"))]
    lengths = re.search(r"local lengths = \{([-1, \n]*)\}", body)
    assert lengths is not None and lengths.group(1).split() == ["-1,"] * (len(names) - 1) + ["-1"]
    assert f"struct.pack('>{'i4' * len(names)}', unpack(lengths))" in body
    # Every field that record() reads is read back.
    source = inspect.getsource(_redis_base.record)
    assert set(re.findall(r'b"([a-z_]+)"', source)) <= set(names)


def test_a_packed_record_that_does_not_match_the_field_list_is_an_error() -> None:
    """A claim's packed reply is read strictly: a value cut short, a length that runs
    past the end, or bytes left over mean the script and READ_FIELDS disagree, and
    the store says so rather than build a record from the wrong fields."""
    from idempotence.stores.redis._store_shared import READ_FIELDS, unpack

    def packed(first: int, last: int, values: bytes) -> bytes:
        absent = (-1,) * (len(READ_FIELDS) - 2)
        return struct.pack(f">{len(READ_FIELDS)}i", first, *absent, last) + values

    whole = packed(1, 3, b"7a:b")
    assert unpack(whole) == {b"id": b"7", b"calling": b"a:b"}
    broken = (
        whole[:-1],  # a value cut short
        whole + b"-",  # bytes left over
        packed(9, 3, b"7a:b"),  # a length past the end
        packed(-2, 3, b"7a:b"),  # neither a length nor absent
        whole[:8],  # the lengths cut short
        b"",
    )
    for reply in broken:
        with pytest.raises(StoreError, match="READ_FIELDS"):
            unpack(reply)


def test_the_lane_packs_bytes_text_and_integers_and_nothing_else() -> None:
    from idempotence.stores.redis._lane import pack

    assert (
        pack(("EVALSHA", b"\x00\r\n", 12))
        == b"*3\r\n$7\r\nEVALSHA\r\n$3\r\n\x00\r\n\r\n$2\r\n12\r\n"
    )
    with pytest.raises(TypeError):
        pack(("SET", b"k", 1.5))  # a float would be sent truncated


def test_f1_an_out_of_band_push_never_shifts_the_async_lanes_replies(
    redis_url: str, redis_prefix: str
) -> None:
    """A RESP3 push (redis-py 8 speaks RESP3 by default; a server sends pushes for
    maintenance notices, invalidations...) is not a command's reply: it is never read
    as one, and one that comes after a reply is not left for the next command, which
    would read its predecessor's answer, and every later command too."""
    key = f"{redis_prefix}:tracked".encode()

    async def main() -> None:
        async with AsyncRedisStore(redis_url, prefix=redis_prefix) as store:
            lane = store._lane
            assert lane is not None
            # One connection (commands one after another): tracking makes the server
            # push an invalidation to it when it writes a key it read.
            assert await lane.execute("CLIENT", "TRACKING", "ON") == b"OK"
            assert await lane.execute("GET", key) is None
            assert await lane.execute("SET", key, b"v") == b"OK"
            assert await lane.execute("PING") == b"PONG"
            assert await lane.execute("GET", key) == b"v"
            assert await lane.execute("ECHO", b"hello") == b"hello"
            assert await lane.execute("DEL", key) == 1

    asyncio.run(main())


def test_a_resp3_false_reply_is_a_reply_not_a_reply_still_on_its_way(redis_url: str) -> None:
    """hiredis reads RESP3's boolean false as False, which is also what its reader
    says of a reply not yet whole: the lane must tell them apart (not wait for the
    rest of a reply that has come, until the timeout)."""

    async def main() -> None:
        async with AsyncRedisStore(redis_url, timeout=2) as store:
            assert store._lane is not None
            script = "redis.setresp(3); return false"
            reply = await store._lane.execute("EVAL", script, 0)
            assert reply is False or reply is None  # RESP3's false; RESP2's nil
            assert await store._lane.execute("PING") == b"PONG"

    asyncio.run(main())


@pytest.mark.parametrize(
    "headers",
    [
        (),
        (("content-type", "application/json"),),
        (("x-quote", 'say "hi" \\ back'), ("x-control", "tab\tnew\nline\x00\x1f")),
        (("x-text", "café – ☃ 𝄞"), ("x-surrogate", "\udcff")),
        [("list", "of pairs")],
    ],
    ids=["none", "plain", "escapes", "non-ascii", "list"],
)
def test_a_finish_writes_the_headers_json_as_json_dumps_does(headers: Any) -> None:
    """The finish sends its headers through an encoder made once (not json.dumps per
    call): it must write exactly what json.dumps writes, and read back the same."""
    import json

    from idempotence.stores.redis._headers import to_json

    assert to_json(headers) == json.dumps(headers)
    assert json.loads(to_json(headers)) == [list(pair) for pair in headers]


@pytest.mark.parametrize("key", HOSTILE, ids=lambda k: repr(k[:12]) + f"/{len(k)}")
def test_hostile_keys_round_trip_in_one_slot(redis_store: Any, scope: str, key: str) -> None:
    hostile_scope = "{" + scope + "}"
    claim = redis_store.claim(request(hostile_scope, key))
    assert claim.outcome is Outcome.EXECUTE
    assert (claim.record.scope, claim.record.key) == (hostile_scope, key)
    assert claim.record == redis_store.get(hostile_scope, key)  # rebuilt, not read back
    redis_store.finish(claim.lease, response())
    assert redis_store.claim(request(hostile_scope, key)).response == response()
    assert redis_store.get(hostile_scope, key).key == key
    assert redis_store.get(hostile_scope, key + "x") is None
    # The hash tag is the digest, whatever braces the scope and key hold.
    name = raw(redis_store).record_key(hostile_scope, key)
    tag = name[name.index(b"{") + 1 : name.index(b"}")]
    assert len(tag) == 24 and tag.isalnum()
    assert redis.cluster.key_slot(name) == redis.cluster.key_slot(b"{" + tag + b"}")


def test_a_prefix_with_a_brace_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="brace"):
        RedisStore(SHARED_URL, prefix="a{b")


# -- P10: a twin is woken by pub/sub -------------------------------------------------------


@pytest.mark.parametrize("settle", ["finish", "release", "forget"])
def test_p10_a_waiting_twin_is_woken_when_the_key_settles(
    redis_store: Any, scope: str, settle: str
) -> None:
    lease = redis_store.claim(request(scope)).lease
    woken: list[float] = []

    def twin() -> None:
        started = time.monotonic()
        redis_store.wait_for_settle(scope, "k1", 10)
        woken.append(time.monotonic() - started)

    thread = threading.Thread(target=twin)
    thread.start()
    time.sleep(0.5)
    if settle == "finish":
        redis_store.finish(lease, response())
    else:
        getattr(redis_store, settle)(lease)
    thread.join(timeout=15)
    assert woken and 0.4 < woken[0] < 2.0, woken  # by the message, not the 10 s bound
    if settle == "finish":
        assert redis_store.claim(request(scope)).outcome is Outcome.REPLAY


def test_p10_a_wait_on_a_settled_key_returns_at_once(redis_store: Any, scope: str) -> None:
    lease = redis_store.claim(request(scope)).lease
    redis_store.release(lease)
    started = time.monotonic()
    redis_store.wait_for_settle(scope, "k1", 10)
    redis_store.wait_for_settle(scope, "unknown", 10)
    assert time.monotonic() - started < 2


def test_p10_a_wait_on_a_lock_past_its_timeout_returns_at_once(
    redis_store: Any, scope: str
) -> None:
    # Its holder died: no one will settle it, and the waiter may take it over now (P5),
    # as on PostgreSQL, whose mark_waiter marks only a live lock.
    redis_store.claim(request(scope, lock_timeout=timedelta(milliseconds=100)))
    time.sleep(0.2)
    started = time.monotonic()
    redis_store.wait_for_settle(scope, "k1", 10)
    assert time.monotonic() - started < 2
    assert redis_store.claim(request(scope)).outcome is Outcome.EXECUTE


# -- failure: fail closed, quickly ----------------------------------------------------------


def test_p11_an_unreachable_redis_raises_store_unavailable_quickly() -> None:
    with redis_server() as server:
        url = server.url
    for store in (RedisStore(url), Blocking(AsyncRedisStore(url), EventLoopThread())):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="Redis"):
            store.claim(request("s"))
        assert time.monotonic() - started < 2


def test_p11_a_redis_that_stops_answering_times_out_as_unavailable() -> None:
    with redis_server() as server:
        store = RedisStore(server.url, timeout=0.5)
        assert store.claim(request("s")).outcome is Outcome.EXECUTE
        os.kill(server.process.pid, signal.SIGSTOP)  # alive, accepting, silent
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                store.claim(request("s", "k2"))
            assert time.monotonic() - started < 2
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        store.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_f1_a_reply_that_came_too_late_never_answers_a_later_command(
    flavour: str, loop_thread: EventLoopThread
) -> None:
    """A command that timed out may still run, and its reply come later, on that
    connection: the store must never read it as the answer to its next command (the
    late ``{1, now}`` of a new key's claim, read by a claim of a locked key, would
    say EXECUTE: a second execution). The store's own connections are dropped after
    a timeout, not put back."""
    with redis_server() as server:
        store: Any = (
            RedisStore(server.url, timeout=0.5)
            if flavour == "sync"
            else Blocking(AsyncRedisStore(server.url, timeout=0.5), loop_thread)  # type: ignore[arg-type]
        )
        try:
            first = store.claim(request("s"))
            assert first.outcome is Outcome.EXECUTE
            server.freeze()
            try:
                with pytest.raises(StoreUnavailable):
                    store.claim(request("s", "k2"))
            finally:
                server.freeze(False)
            time.sleep(0.2)  # the late reply is sent now, to the timed-out connection
            for key in ("k1", "k2"):  # k2's claim ran late on the server: k2 is held
                claim = store.claim(request("s", key))
                assert claim.outcome is Outcome.IN_PROGRESS, key
                assert claim.record.key == key
            assert store.claim(request("s", "k3")).record.key == "k3"
        finally:
            store.close()


def test_f1_a_cancelled_commands_late_reply_never_answers_a_later_command() -> None:
    """An async claim cancelled while it waits (the client went away) may still run on
    the server, and its reply come later on that connection: the reply keeps its
    command's place and is dropped, so the next claims read their own answers."""
    with redis_server() as server:

        async def main() -> None:
            async with AsyncRedisStore(server.url, timeout=5) as store:
                assert (await store.claim(request("s"))).outcome is Outcome.EXECUTE
                server.freeze()
                try:
                    waiting = asyncio.ensure_future(store.claim(request("s", "k2")))
                    await asyncio.sleep(0.2)
                    waiting.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await waiting
                finally:
                    server.freeze(False)
                # No pause: the next claim goes out before the late reply is read, so
                # a connection put back would take that reply ({1, now}: EXECUTE) as
                # its answer for k1, which is held.
                for key in ("k1", "k2"):  # k2's claim ran late on the server: k2 is held
                    claim = await store.claim(request("s", key))
                    assert claim.outcome is Outcome.IN_PROGRESS, key
                    assert claim.record.key == key
                assert (await store.claim(request("s", "k3"))).record.key == "k3"

        asyncio.run(main())


def test_f1_commands_in_flight_share_one_connection_and_each_reads_its_own_reply(
    redis_url: str, redis_prefix: str
) -> None:
    """The async lane sends every command in flight on one connection and matches the
    replies to them in order: 300 at once, some answered with an error, each reads
    its own reply, and the server saw one connection of the lane's, not 300."""
    names = [f"{redis_prefix}:many:{i}".encode() for i in range(300)]

    async def main() -> None:
        async with AsyncRedisStore(redis_url, prefix=redis_prefix) as store:
            lane = store._lane
            assert lane is not None
            await asyncio.gather(*(lane.execute("SET", n, b"v%d" % i) for i, n in enumerate(names)))
            opened = await lane.execute("CLIENT", "ID")

            async def one(i: int) -> Any:
                if i % 7 == 3:  # an error reply is its command's alone
                    with pytest.raises(redis.ResponseError, match="not an integer"):
                        await lane.execute("INCR", names[i])
                    return "error"
                return await lane.execute("GET", names[i])

            replies = await asyncio.gather(*(one(i) for i in range(len(names))))
            assert replies == ["error" if i % 7 == 3 else b"v%d" % i for i in range(len(names))]
            assert await lane.execute("CLIENT", "ID") == opened  # the same connection
            await lane.execute("DEL", *names)

    asyncio.run(main())


async def _mixed_keys(store: AsyncRedisStore, count: int) -> list[tuple[str, Outcome, int]]:
    """``count`` keys of scope "s" whose claims answer three ways, so that a claim
    that read another's reply shows it: k0, k3... finished (REPLAY of response(i)),
    k1, k4... held (IN_PROGRESS), the others new (EXECUTE)."""
    keys = []
    for i in range(count):
        key, outcome = f"k{i}", (Outcome.REPLAY, Outcome.IN_PROGRESS, Outcome.EXECUTE)[i % 3]
        if outcome is not Outcome.EXECUTE:
            lease = (await store.claim(request("s", key))).lease
            if outcome is Outcome.REPLAY:
                await store.finish(lease, response(i))
        keys.append((key, outcome, i))
    return keys


def _is_own(claim: Claim, key: str, outcome: Outcome, n: int) -> bool:
    record = claim.record
    own = record.response == response(n) if outcome is Outcome.REPLAY else True
    return (claim.outcome, record.key) == (outcome, key) and own


def test_f1_claims_cancelled_in_the_middle_of_a_pipeline_shift_no_reply() -> None:
    """Claims in flight together, some given up while the server is stalled: their
    replies still come, in their places, and are dropped; every other claim reads
    its own outcome (replay, in progress or execute, by its key's state). A given-up
    claim had been sent, so it ran: a new key of one is held."""
    with redis_server() as server:

        async def main() -> None:
            async with AsyncRedisStore(server.url, timeout=5) as store:
                keys = await _mixed_keys(store, 18)
                server.freeze()
                try:
                    claims = [asyncio.ensure_future(store.claim(request("s", k))) for k, *_ in keys]
                    await asyncio.sleep(0.2)
                    for given_up in claims[1::2]:
                        given_up.cancel()
                finally:
                    server.freeze(False)
                for (key, outcome, n), kept in zip(keys[::2], claims[::2], strict=True):
                    claim = await kept
                    assert _is_own(claim, key, outcome, n), (key, claim.outcome, claim.record)
                for (key, outcome, n), given_up in zip(keys[1::2], claims[1::2], strict=True):
                    with pytest.raises(asyncio.CancelledError):
                        await given_up
                    held = Outcome.IN_PROGRESS if outcome is Outcome.EXECUTE else outcome
                    later = await store.claim(request("s", key))
                    assert _is_own(later, key, held, n), (key, later.outcome, later.record)

        asyncio.run(main())


def test_f1_p11_a_stalled_server_fails_every_command_in_flight_then_serves_again() -> None:
    """Commands in flight when the server stalls all fail within the timeout
    (StoreUnavailable: nothing runs, P11); the claims that come next, and must open a
    connection, fail together in about one timeout too, not one after the other
    (each waiting out its own connect); once the server answers again, the late
    replies on the old connection answer nothing and each claim reads its own."""
    with redis_server() as server:

        async def main() -> None:
            async with AsyncRedisStore(server.url, timeout=0.5) as store:
                keys = await _mixed_keys(store, 9)
                server.freeze()
                try:
                    for wave in range(2):  # in flight; then waiting for a connection
                        started = time.monotonic()
                        failed = await asyncio.gather(
                            *(store.claim(request("s", k)) for k, *_ in keys),
                            return_exceptions=True,
                        )
                        assert all(isinstance(f, StoreUnavailable) for f in failed), failed
                        assert time.monotonic() - started < 1.5, wave
                finally:
                    server.freeze(False)
                await asyncio.sleep(0.2)  # the late replies come to the failed connection
                for key, outcome, n in keys:
                    claim = await store.claim(request("s", key))
                    # A new key's failed claims may have run late on the server: held.
                    late = Outcome.IN_PROGRESS if outcome is Outcome.EXECUTE else outcome
                    own = _is_own(claim, key, outcome, n) or _is_own(claim, key, late, n)
                    assert own, (key, claim.outcome)

        asyncio.run(main())


def test_f1_a_loop_held_up_past_the_timeout_fails_no_command_answered_meanwhile() -> None:
    """A blocking call in the app holds the event loop up past the timeout while
    claims are in flight or about to be written: their replies come meanwhile, and
    the claims get them, rather than a timeout (503) for keys they did claim."""
    with redis_server() as server:

        async def main() -> None:
            async with AsyncRedisStore(server.url, timeout=0.5) as store:
                assert (await store.claim(request("s", "warm"))).outcome is Outcome.EXECUTE

                claims = [
                    asyncio.ensure_future(store.claim(request("s", f"k{i}"))) for i in range(3)
                ]
                asyncio.get_running_loop().call_soon(time.sleep, 0.7)  # the app blocks
                for i, claim in enumerate(await asyncio.gather(*claims)):
                    assert (claim.outcome, claim.record.key) == (Outcome.EXECUTE, f"k{i}")

        asyncio.run(main())


def test_a_lane_closed_while_it_connects_leaves_no_connection_open() -> None:
    """The store closed while a command waits for its connection: the connection
    that then opens is closed at once, not left to the server."""
    with redis_server() as server:

        async def main() -> None:
            store = AsyncRedisStore(server.url, timeout=2)
            assert store._lane is not None
            server.freeze()
            try:
                waiting = asyncio.ensure_future(store._lane.execute("PING"))
                await asyncio.sleep(0.2)
                await store.close()
            finally:
                server.freeze(False)
            with pytest.raises(redis.ConnectionError, match="closed"):
                await waiting
            await asyncio.sleep(0.2)
            with redis.Redis.from_url(server.url) as admin:
                assert len(admin.client_list()) == 1, admin.client_list()  # admin's own

        asyncio.run(main())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_scripts_are_loaded_again_after_the_server_forgot_them(
    flavour: str, loop_thread: EventLoopThread
) -> None:
    """EVALSHA answers NOSCRIPT after a restart or a SCRIPT FLUSH: the store loads the
    script and runs it, once."""
    with redis_server() as server:
        store: Any = (
            RedisStore(server.url)
            if flavour == "sync"
            else Blocking(AsyncRedisStore(server.url), loop_thread)  # type: ignore[arg-type]
        )
        client = redis.Redis.from_url(server.url)
        try:
            lease = store.claim(request("s")).lease
            client.script_flush()
            errors = client.info("stats")["total_error_replies"]
            store.finish(lease, response())
            client.script_flush()
            assert store.claim(request("s")).response == response()
            # One NOSCRIPT per flush: each script was loaded again, then ran.
            assert client.info("stats")["total_error_replies"] - errors == 2
        finally:
            client.close()
            store.close()


def test_a_closed_store_is_unavailable(redis_prefix: str) -> None:
    store = RedisStore(SHARED_URL, prefix=redis_prefix)
    store.close()
    with pytest.raises(StoreUnavailable):
        store.claim(request("s"))


def test_a_record_that_scan_returns_twice_is_listed_once(redis_prefix: str) -> None:
    # SCAN may return a key more than once while Redis resizes its table; the listing
    # (keys list, stats) must not count it twice.
    store = RedisStore(SHARED_URL, prefix=redis_prefix)
    for key in ("a", "b", "c"):
        store.claim(request("s", key))
    scan = store.client.scan_iter

    def each_twice(*args: Any, **kw: Any) -> Iterator[bytes]:
        for name in scan(*args, **kw):
            yield name
            yield name

    store.client.scan_iter = each_twice  # type: ignore[method-assign]
    try:
        assert sorted(found.key for found in store.records()) == ["a", "b", "c"]
        assert sorted(found.key for found in store.records("s")) == ["a", "b", "c"]
    finally:
        store.close()


# -- URLs, configuration -------------------------------------------------------------------


def test_open_store_takes_a_redis_url() -> None:
    assert DatabaseUrl.parse("rediss://h:6380/1").backend == "redis"
    assert DatabaseUrl.parse("redis+cluster://h:7000").target == "redis+cluster://h:7000"
    with pytest.raises(ConfigurationError, match="invalid port"):
        DatabaseUrl.parse("redis://h:99999/0")
    store = open_store(SHARED_URL)
    assert isinstance(store, RedisStore)
    assert store.migrate() == []
    store.close()
    assert isinstance(open_async_store(SHARED_URL), AsyncRedisStore)
    with pytest.raises(ConfigurationError, match="needs a SQL database"):
        open_sql_store(SHARED_URL)


def test_a_client_that_decodes_responses_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="decode_responses"):
        RedisStore(redis.Redis.from_url(SHARED_URL, decode_responses=True))


@pytest.mark.parametrize(
    "policy", [Policy(transaction=True), Policy(flow=Flow("redis-refused"))], ids=["tx", "flow"]
)
def test_the_http_configuration_refuses_shared_transactions_on_redis(policy: Policy) -> None:
    store = RedisStore(SHARED_URL)
    with pytest.raises(ConfigurationError, match=r"RedisStore.*need a SQL store"):
        Idempotency(store=store, scope=single_tenant(), endpoints=[Endpoint("POST /x", policy)])
    Idempotency(store=store, scope=single_tenant(), endpoints=[Endpoint("POST /x")])
    store.close()


# -- Redis Cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """Three primaries in cluster mode on ports of their own."""
    with redis_cluster(3) as servers:
        yield f"redis+cluster://127.0.0.1:{servers[0].port}"


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_cluster_keeps_each_record_in_one_slot_and_spreads_the_records(
    cluster: str, flavour: str, loop_thread: EventLoopThread
) -> None:
    store: Any = (
        RedisStore(cluster)
        if flavour == "sync"
        else Blocking(AsyncRedisStore(cluster), loop_thread)  # type: ignore[arg-type]
    )
    scope = "{tenant}" + uuid.uuid4().hex
    keys = [f"k{{{n}}}" for n in range(30)] + HOSTILE[:7]
    try:
        for key in keys:
            claim = store.claim(request(scope, key))
            assert claim.outcome is Outcome.EXECUTE
            assert store.claim(request(scope, key)).outcome is Outcome.IN_PROGRESS
            store.finish(claim.lease, response())
            assert store.claim(request(scope, key)).response == response()
        zombie = store.claim(request(scope, "z", lock_timeout=SHORT)).lease
        time.sleep(SHORT.total_seconds() + 0.1)
        taker = store.claim(request(scope, "z")).lease
        with pytest.raises(LockLost):
            store.finish(zombie, response(666))
        store.finish(taker, response(2))
        with redis.cluster.RedisCluster.from_url(cluster.replace("+cluster", "")) as client:
            names = [record_key("idempotence", scope, key) for key in keys]
            nodes = {client.get_node_from_key(name).name for name in names}
        assert len(nodes) == 3  # the records are spread over the three primaries
    finally:
        store.close()


@pytest.mark.slow
def test_cluster_wakes_a_waiting_twin(cluster: str) -> None:
    store = RedisStore(cluster)
    scope = uuid.uuid4().hex
    lease = store.claim(request(scope)).lease
    timer = threading.Timer(0.3, lambda: store.finish(lease, response()))
    timer.start()
    started = time.monotonic()
    store.wait_for_settle(scope, "k1", 10)
    assert time.monotonic() - started < 3
    timer.join()
    store.close()


def test_cleanup_helper_deletes_only_its_prefix(redis_prefix: str) -> None:
    with redis.Redis.from_url(SHARED_URL) as client:
        client.set(f"{redis_prefix}:x", 1)
        client.set(f"{redis_prefix}x:y", 1)
        assert delete_prefix(client, redis_prefix) == 1
        assert client.delete(f"{redis_prefix}x:y") == 1


@pytest.mark.slow
def test_the_cli_on_redis(tmp_path: Any) -> None:
    cli = os.path.join(os.path.dirname(os.sys.executable), "idempotence")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [cli, *args, "--database", url], capture_output=True, text=True, timeout=60
        )

    with redis_server() as server:
        url = server.url
        store = RedisStore(url)
        store.finish(store.claim(request("acct")).lease, response())
        store.claim(request("acct", "busy"))
        store.close()
        migrate = run("migrate")
        assert (migrate.returncode, migrate.stderr.strip()) == (
            0,
            "nothing to migrate: a Redis key store has no schema",
        )
        assert run("reap").returncode == 0 and "nothing to reap" in run("reap").stderr
        listing = run("keys", "list", "--scope", "acct")
        assert listing.returncode == 0, listing.stderr
        assert "busy" in listing.stdout and "processing" in listing.stdout
        assert "complete" in run("keys", "list", "--state", "complete").stdout
        assert "response.status     201" in run("keys", "show", "acct", "k1").stdout
        assert run("keys", "show", "acct", "nope").returncode == 4
        assert run("keys", "evict", "acct", "busy").returncode == 1
        assert run("keys", "evict", "acct", "busy", "--force").returncode == 0
        stats = run("stats")
        assert stats.returncode == 0 and "total keys       1" in stats.stdout
        for command in (["sweep"], ["worker"], ["reconcile", "rides", "--since", "1h"]):
            refused = run(*command)
            assert refused.returncode == 2, refused.stderr
            assert "needs a SQL database" in refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1
        server.stop()
        assert run("keys", "list").returncode == 5  # unavailable


def test_without_redis_py_the_package_imports_and_the_store_says_what_to_install() -> None:
    script = (
        "import sys; sys.modules['redis'] = None\n"
        "import idempotence, idempotence.cli\n"
        "assert idempotence.open_store('sqlite:///:memory:') is not None\n"
        "try:\n"
        "    idempotence.RedisStore\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [os.sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'idempotence[redis]'" in done.stdout


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_instrumentation_sees_claims_and_refused_writes(
    flavour: str, redis_prefix: str, scope: str, loop_thread: EventLoopThread
) -> None:
    from idempotence import Instrumentation
    from idempotence.observability import Watch

    seen: list[Any] = []

    class Recorder(Instrumentation):
        def claim(self, request: ClaimRequest) -> Watch[Any]:
            class Seen(Watch[Any]):
                def done(self, result: Any) -> Any:
                    seen.append(("claim", request.key, result.outcome))
                    return result

            return Seen()

        def lock_lost(self, operation: str, error: LockLost) -> None:
            seen.append(("lock_lost", operation, error.token))

    url = require(SHARED_URL)
    opened = (RedisStore if flavour == "sync" else AsyncRedisStore)(
        url, prefix=redis_prefix, instrumentation=Recorder()
    )
    store: Any = opened if flavour == "sync" else Blocking(opened, loop_thread)  # type: ignore[arg-type]
    try:
        lease = store.claim(request(scope)).lease
        store.finish(lease, response())
        with pytest.raises(LockLost):
            store.release(lease)
    finally:
        store.close()
    assert seen == [("claim", "k1", Outcome.EXECUTE), ("lock_lost", "release", 1)]


def test_p11_an_idle_connection_the_server_closed_costs_no_request() -> None:
    """Redis restarted while the store sat idle: its idle connections are dead, and
    the next operations open new ones instead of failing (as redis-py's own pool
    checks at each checkout). Before, each idle connection failed one request."""
    with redis_server() as server:
        with RedisStore(server.url, timeout=2) as store:
            store.finish(store.claim(request("s", "a")).lease, response())
            server.stop()
            server.start()  # empty: nothing is persisted
            for key in ("b", "c"):
                claim = store.claim(request("s", key))
                assert claim.outcome is Outcome.EXECUTE
                store.finish(claim.lease, response())

        async def main() -> None:
            async with AsyncRedisStore(server.url, timeout=2) as store:
                await store.finish((await store.claim(request("t", "a"))).lease, response())
                server.stop()
                # An idle store's loop goes on running and reads the close; here the
                # blocking stop() held it, so give it a turn (as any idle moment would).
                await asyncio.sleep(0.2)
                server.start()
                for key in ("b", "c"):
                    claim = await store.claim(request("t", key))
                    assert claim.outcome is Outcome.EXECUTE
                    await store.finish(claim.lease, response())

        asyncio.run(main())


def test_a_replays_headers_are_decoded_once_and_the_kept_ones_stay_bounded() -> None:
    """Replays decode their stored headers' JSON through a small cache: the same text
    gives the same pairs, another text its own, and neither the number of texts kept
    nor their length grows past its bound."""
    headers = _redis_headers.read
    one, two = b'[["a", "1"]]', b'[["a", "2"]]'
    assert headers(one) == (("a", "1"),) and headers(two) == (("a", "2"),)
    assert headers(bytes(one)) is headers(one)
    for n in range(_redis_headers.KEPT * 2):
        assert headers(b'[["n", "%d"]]' % n) == (("n", str(n)),)
        assert len(_redis_headers._read) <= _redis_headers.KEPT
    long = b'[["x", "%s"]]' % (b"y" * _redis_headers.LONGEST)
    assert headers(long) == (("x", "y" * _redis_headers.LONGEST),)
    assert long not in _redis_headers._read


def test_a_finishs_headers_are_written_once_and_the_kept_ones_stay_bounded() -> None:
    """Finishes write their headers' JSON through a small cache: the same headers give
    the same bytes, json.dumps's, and only tuples of strs are kept, never past the
    bound in number or length."""
    import json

    write = _redis_headers.write
    one = (("a", "1"),)
    assert write(one) == b'[["a", "1"]]' and write((("a", "1"),)) is write(one)
    for n in range(_redis_headers.KEPT * 2):
        assert write((("n", str(n)),)) == b'[["n", "%d"]]' % n
        assert len(_redis_headers._written) <= _redis_headers.KEPT
    long = (("x", "y" * _redis_headers.LONGEST),)
    assert write(long) == b'[["x", "%s"]]' % (b"y" * _redis_headers.LONGEST)
    assert long not in _redis_headers._written
    number = (("n", 1),)
    assert write(number) == write(number) == b'[["n", 1]]'
    assert number not in _redis_headers._written
    listed = (("n", "1"), ["m", "2"])
    assert write(listed) == write(listed) == json.dumps(listed).encode()
