"""Redis writes that wait for a replica (issue 35 item 5, DESIGN 13): ``replicas=N``.

A master and a replica, each a redis-server of the test's own. While the replica
answers, a finish returns only once the replica has it. Frozen (SIGSTOP: it neither
acknowledges nor drops the link), the store reports nothing done that only the master
holds: the finish, a new claim and a replay of a finish the replica lacks all fail
closed (StoreUnavailable) within the replica timeout, and a claim's lock that the
replica never saw is freed, so the retry after the thaw takes the key at once. The
store without the option shows what the wait guards against: the same replay
answered from the master alone. Through the HTTP middleware, a claim the replica
cannot confirm is a 503 with Retry-After, and the handler does not run.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
import redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotence.errors import StoreUnavailable
from idempotence.http import Endpoint, Idempotency, IdempotencyMiddleware, single_tenant
from idempotence.states import ClaimRequest, Outcome, StoredResponse
from idempotence.stores.redis import AsyncRedisStore, RedisStore
from idempotence.stores.redis._store_shared import record_key
from tests.support.redis import RedisServer, caught_up, replicated
from tests.support.stores import Blocking, EventLoopThread

REPLICA_TIMEOUT = 0.3


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    with replicated() as servers:
        yield servers


def request(key: str) -> ClaimRequest:
    return ClaimRequest(scope="s", key=key, fingerprint="f" * 64, lock_timeout=timedelta(seconds=5))


def open_store(flavour: str, url: str, prefix: str, **options: object) -> RedisStore:
    if flavour == "sync":
        return RedisStore(url, prefix=prefix, **options)  # type: ignore[arg-type]
    loop = EventLoopThread()
    store: RedisStore = Blocking(AsyncRedisStore(url, prefix=prefix, **options), loop)  # type: ignore[arg-type,assignment]
    return store


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_write_the_replica_did_not_acknowledge_is_never_reported_done(
    pair: tuple[RedisServer, RedisServer], flavour: str
) -> None:
    master, replica = pair
    prefix = f"idemtest{uuid.uuid4().hex[:8]}"
    store = open_store(flavour, master.url, prefix, replicas=1, replica_timeout=REPLICA_TIMEOUT)
    other = open_store(flavour, master.url, prefix, replicas=1, replica_timeout=REPLICA_TIMEOUT)
    plain = RedisStore(master.url, prefix=prefix)
    try:
        with redis.Redis(port=replica.port) as copy:
            claim = store.claim(request("healthy"))
            assert claim.lease is not None
            store.finish(claim.lease, StoredResponse.of(201, body=b"healthy"))
            # Returned only once the replica had it: read there, at once.
            assert copy.hget(record_key(prefix, "s", "healthy"), "status") == b"201"

        # The other store's connection has written and been acknowledged: its WAIT
        # would return at once for anything but a write of its own.
        warm = other.claim(request("warm"))
        assert warm.lease is not None
        other.finish(warm.lease, StoredResponse.of(201, body=b"warm"))

        claim = store.claim(request("k"))
        assert claim.outcome is Outcome.EXECUTE and claim.lease is not None
        replica.freeze()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="not reported done"):
            store.finish(claim.lease, StoredResponse.of(201, body=b"first"))
        took = time.monotonic() - started
        assert REPLICA_TIMEOUT <= took < REPLICA_TIMEOUT + 1.0
        # The master has the finish; a replay of it, from another connection, waits
        # for the replica too, and is refused: it would be lost with the master.
        with pytest.raises(StoreUnavailable, match="not reported done"):
            other.claim(request("k"))
        # (Without the option the master alone answers it: what a failover can lose.)
        assert plain.claim(request("k")).outcome is Outcome.REPLAY
        # A new key's claim is refused, and its lock, held on the master, freed.
        with pytest.raises(StoreUnavailable, match="not reported done"):
            store.claim(request("new"))

        replica.freeze(False)
        caught_up(master, replica)
        replay = other.claim(request("k"))
        assert replay.outcome is Outcome.REPLAY and replay.record.response is not None
        assert replay.record.response.body == b"first"
        retry = store.claim(request("new"))  # not a 409 until the lock lapses
        assert retry.outcome is Outcome.EXECUTE and retry.record.lock_token == 2
    finally:
        replica.freeze(False)
        for each in (store, other, plain):
            each.close()


def test_without_a_replica_every_write_fails_closed_at_once(
    pair: tuple[RedisServer, RedisServer],
) -> None:
    """Two replicas asked of a master that has one: no write is ever reported."""
    master, _ = pair
    with RedisStore(master.url, prefix=f"idemtest{uuid.uuid4().hex[:8]}", replicas=2) as store:
        with pytest.raises(StoreUnavailable, match="reached 1 of the 2 replica"):
            store.claim(request("k"))
        assert store.get("s", "k") is not None  # the master's record, unlocked
        assert store.get("s", "k").locked_at is None  # type: ignore[union-attr]


def test_p11_a_claim_no_replica_confirms_answers_503_and_runs_nothing(
    pair: tuple[RedisServer, RedisServer],
) -> None:
    master, replica = pair
    ran: list[int] = []

    async def endpoint(request: Request) -> JSONResponse:
        ran.append(1)
        return JSONResponse({"ok": True}, status_code=201)

    async def main() -> list[httpx.Response]:
        store = AsyncRedisStore(
            f"{master.url}?replicas=1&replica_timeout={REPLICA_TIMEOUT}",
            prefix=f"idemtest{uuid.uuid4().hex[:8]}",
        )
        config = Idempotency(store=store, scope=single_tenant(), endpoints=[Endpoint("POST /x")])
        app = IdempotencyMiddleware(
            Starlette(routes=[Route("/x", endpoint, methods=["POST"])]), config
        )
        transport = httpx.ASGITransport(app=app)
        answers = []
        key = {"idempotency-key": "k"}
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                with replica.frozen():
                    answers.append(await client.post("/x", json={}, headers=key))
                caught_up(master, replica)
                answers.append(await client.post("/x", json={}, headers=key))
                answers.append(await client.post("/x", json={}, headers=key))
        finally:
            await store.close()
        return answers

    refused, executed, replayed = asyncio.run(main())
    assert refused.status_code == 503 and "retry-after" in refused.headers, refused.text
    assert executed.status_code == 201 and replayed.headers.get("idempotent-replayed") == "true"
    assert ran == [1]  # not while the replica could not confirm the claim
