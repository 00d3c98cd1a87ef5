"""Request-as-transaction (F3) costs a store no trip beyond what the bare transaction
makes: the claim rides with the BEGIN and the deferred finish with the COMMIT. On async
SQLite a trip is a call on the connection's thread, time the one write lock is held; on
PostgreSQL it is a network round trip, counted by a proxy in front of the server."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from idempotence import (
    AsyncSqliteStore,
    ClaimRequest,
    LockLost,
    Outcome,
    StoredResponse,
    StoreUnavailable,
)
from idempotence.consumers import Consumer, Message, process
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from idempotence.stores.sqlite import _store as sqlite_store
from idempotence.stores.sqlite import _store_shared as _sqlite_base
from tests.support.roundtrips import RoundTrips, round_trips

INSERT = "INSERT INTO side_effects (note) VALUES (:note)"


def _request(key: str) -> ClaimRequest:
    return ClaimRequest(scope="trips", key=key, fingerprint="f", lock_timeout=timedelta(seconds=30))


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every call the async SQLite store sends to a connection's thread."""
    seen: list[str] = []
    real = sqlite_store._ThreadedConnection._call

    async def counted(self: Any, fn: Any, *args: Any) -> Any:
        seen.append(getattr(fn, "__name__", type(fn).__name__))
        return await real(self, fn, *args)

    monkeypatch.setattr(sqlite_store._ThreadedConnection, "_call", counted)
    return seen


def test_f3_a_claimed_transaction_makes_as_many_trips_as_a_bare_one(sqlite_path, trips):
    async def main() -> tuple[int, int]:
        store = AsyncSqliteStore(sqlite_path)
        try:
            await store.migrate()
            async with store.transaction() as tx:
                await tx.execute("CREATE TABLE side_effects (note TEXT)")
            trips.clear()
            async with store.transaction() as tx:
                await tx.execute(INSERT, {"note": "bare"})
            bare = len(trips)
            trips.clear()
            async with store.transaction(claim=_request("k1")) as tx:
                assert tx.claim is not None and tx.claim.outcome is Outcome.EXECUTE
                assert tx.claim.lease is not None
                await tx.execute(INSERT, {"note": "guarded"})
                response = StoredResponse.of(201, body="{}")
                await store.finish(tx.claim.lease, response, tx=tx, at_commit=True)
            guarded = len(trips)
            replay = await store.claim(_request("k1"))
            assert replay.outcome is Outcome.REPLAY and replay.response == response
            return bare, guarded
        finally:
            await store.close()

    bare, guarded = asyncio.run(main())
    assert bare == 3  # BEGIN, the INSERT, COMMIT
    assert guarded == bare, f"{guarded} trips for a claimed transaction, {bare} bare"


# -- PostgreSQL: network round trips --------------------------------------------------

PG_INSERT = "INSERT INTO trip_effects (note) VALUES (%(note)s)"
# Enough runs for psycopg to have prepared every statement (after five), so that no
# PREPARE lands in a counted run.
WARM_UP = 8


class _Counted:
    """Round trips, and statements sent, of one block, on a store of one connection."""

    def __init__(self, proxy: RoundTrips) -> None:
        self.proxy = proxy
        self.counts: dict[str, int] = {}
        self.statements: dict[str, int] = {}

    @contextmanager
    def counting(self, name: str, counted: bool) -> Iterator[None]:
        before, sent = self.proxy.count, self.proxy.statements
        yield
        if counted:
            self.counts[name] = self.proxy.count - before
            self.statements[name] = self.proxy.statements - sent


def _pg_sync(url: str, counted: _Counted) -> None:
    with PostgresStore(url, max_size=1) as store:
        with store.transaction() as tx:
            tx.execute("CREATE TABLE IF NOT EXISTS trip_effects (note text)")
        for n in range(WARM_UP + 1):
            last = n == WARM_UP
            with counted.counting("bare", last), store.transaction() as tx:
                tx.execute(PG_INSERT, {"note": "bare"})
            with (
                counted.counting("claimed", last),
                store.transaction(claim=_request(f"s{n}")) as tx,
            ):
                assert tx.claim is not None and tx.claim.lease is not None
                tx.execute(PG_INSERT, {"note": "guarded"})
                store.finish(tx.claim.lease, StoredResponse.of(201), tx=tx, at_commit=True)
            # A claim that does not win rolls its transaction back.
            with (
                counted.counting("rolled back", last),
                pytest.raises(_Rollback),
                store.transaction(claim=_request(f"s{n}")) as tx,
            ):
                assert tx.claim is not None and tx.claim.outcome is Outcome.REPLAY
                raise _Rollback()


async def _pg_async(url: str, counted: _Counted) -> None:
    async with AsyncPostgresStore(url, max_size=1) as store:
        async with store.transaction() as tx:
            await tx.execute("CREATE TABLE IF NOT EXISTS trip_effects (note text)")
        for n in range(WARM_UP + 1):
            last = n == WARM_UP
            with counted.counting("bare", last):
                async with store.transaction() as tx:
                    await tx.execute(PG_INSERT, {"note": "bare"})
            with counted.counting("claimed", last):
                async with store.transaction(claim=_request(f"a{n}")) as tx:
                    assert tx.claim is not None and tx.claim.lease is not None
                    await tx.execute(PG_INSERT, {"note": "guarded"})
                    response = StoredResponse.of(201)
                    await store.finish(tx.claim.lease, response, tx=tx, at_commit=True)
            with counted.counting("rolled back", last), pytest.raises(_Rollback):
                async with store.transaction(claim=_request(f"a{n}")) as tx:
                    assert tx.claim is not None and tx.claim.outcome is Outcome.REPLAY
                    raise _Rollback()


EXPIRE_LOCK = "UPDATE idempotency_keys SET locked_at = now() - interval '1 hour' WHERE key = %(k)s"


class _Rollback(Exception):
    pass


@pytest.mark.parametrize("api", ["sync", "async"])
def test_f3_on_postgres_a_claimed_transaction_makes_as_many_round_trips_as_a_bare_one(
    pg_url: str, api: str
) -> None:
    with round_trips(pg_url) as proxy:
        counted = _Counted(proxy)
        if api == "sync":
            _pg_sync(proxy.url, counted)
        else:
            asyncio.run(_pg_async(proxy.url, counted))
    # BEGIN, the INSERT, COMMIT; claimed: BEGIN and the claim, the INSERT, the finish
    # and the COMMIT; rolled back: BEGIN and the claim, ROLLBACK (with psycopg's own
    # transaction a rollback also deallocated every prepared statement: one more).
    assert counted.counts == {"bare": 3, "claimed": 3, "rolled back": 2}
    # And no statement more than those, with the planning settings: bare, "BEGIN; SET
    # LOCAL ..." (one simple query), the INSERT, COMMIT; claimed, BEGIN, the claim
    # (which restores the planning settings itself), the INSERT, the settings for the
    # finish's plan, the finish, COMMIT: one statement more than the hand-written floor
    # (benchmarks/profile_request.py --trips), the price of plans that stay index
    # lookups (_store_shared.COMMIT_PLANNING); rolled back, BEGIN, the claim, ROLLBACK.
    assert counted.statements == {"bare": 3, "claimed": 6, "rolled back": 3}


@pytest.mark.parametrize("api", ["sync", "async"])
def test_f1_on_postgres_a_finish_sent_with_the_commit_is_refused_by_the_fence(
    pg_url: str, api: str
) -> None:
    # The finish and the COMMIT go out together, so the finish cannot be looked at
    # before the COMMIT runs: a refused one must stop the COMMIT by failing. A zombie
    # (its lock taken over) commits none of its writes, and the connection is clean
    # for the next transaction.
    async def body(store: Any, key: str) -> tuple[int, Outcome]:
        zombie = (await _maybe(store.claim(_request(key)))).lease
        async with _tx(store) as tx:  # the takeover: the zombie's lock has expired
            await _maybe(tx.execute(EXPIRE_LOCK, {"k": key}))
        winner = (await _maybe(store.claim(_request(key)))).lease
        assert winner is not None and winner.token == zombie.token + 1
        with pytest.raises(LockLost):
            async with _tx(store) as tx:
                await _maybe(tx.execute(PG_INSERT, {"note": key}))
                await _maybe(store.finish(zombie, StoredResponse.of(201), tx=tx, at_commit=True))
        async with _tx(store) as tx:
            rows = await _maybe(
                tx.execute("SELECT count(*) AS n FROM trip_effects WHERE note = %(k)s", {"k": key})
            )
        state = (await _maybe(store.claim(_request(key)))).outcome
        return rows[0]["n"], state

    if api == "sync":
        with PostgresStore(pg_url, max_size=1) as store:
            with store.transaction() as tx:
                tx.execute("CREATE TABLE IF NOT EXISTS trip_effects (note text)")
            written, state = asyncio.run(body(store, "zombie-sync"))
    else:

        async def main() -> tuple[int, Outcome]:
            async with AsyncPostgresStore(pg_url, max_size=1) as store:
                async with store.transaction() as tx:
                    await tx.execute("CREATE TABLE IF NOT EXISTS trip_effects (note text)")
                return await body(store, "zombie-async")

        written, state = asyncio.run(main())
    assert written == 0  # the zombie's INSERT rolled back with its refused finish
    assert state is Outcome.IN_PROGRESS  # the winner still holds the key


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@asynccontextmanager
async def _tx(store: Any, claim: ClaimRequest | None = None) -> AsyncIterator[Any]:
    """``store.transaction(claim=...)`` of a sync or an async store, in async code."""
    if isinstance(store, PostgresStore):
        with store.transaction(claim=claim) as tx:
            yield tx
    else:
        async with store.transaction(claim=claim) as tx:
            yield tx


@pytest.mark.parametrize("api", ["sync", "async"])
def test_f3_on_postgres_a_connection_lost_before_the_commit_commits_nothing(
    pg_url: str, api: str
) -> None:
    # The finish and the COMMIT go out together; if the connection dies before they
    # do, the store must report the store unavailable (the HTTP layer answers 503, and
    # the retry is safe) and the claim and the writes must be gone with it.
    key = f"lost-{api}"

    def kill(pid: int) -> None:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    async def body(store: Any) -> Outcome:
        async with _tx(store) as tx:
            await _maybe(tx.execute("CREATE TABLE IF NOT EXISTS trip_effects (note text)"))
        with pytest.raises(StoreUnavailable):
            async with _tx(store, _request(key)) as tx:
                await _maybe(tx.execute(PG_INSERT, {"note": key}))
                response = StoredResponse.of(201)
                await _maybe(store.finish(tx.claim.lease, response, tx=tx, at_commit=True))
                kill((await _maybe(tx.execute("SELECT pg_backend_pid() AS pid")))[0]["pid"])
        async with _tx(store) as tx:  # on a fresh connection: the pool dropped the dead one
            rows = await _maybe(
                tx.execute("SELECT count(*) AS n FROM trip_effects WHERE note = %(k)s", {"k": key})
            )
        assert rows[0]["n"] == 0
        return (await _maybe(store.claim(_request(key)))).outcome

    if api == "sync":
        with PostgresStore(pg_url, max_size=1) as store:
            outcome = asyncio.run(body(store))
    else:

        async def main() -> Outcome:
            async with AsyncPostgresStore(pg_url, max_size=1) as store:
                return await body(store)

        outcome = asyncio.run(main())
    assert outcome is Outcome.EXECUTE  # never claimed: the first claim of the key


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every statement a SQLite store runs (the application's: "application")."""
    seen: list[str] = []
    real = _sqlite_base.SqliteConnection.fetch

    def counted(self: Any, query: Any) -> Any:
        seen.append(query.name)
        return real(self, query)

    monkeypatch.setattr(_sqlite_base.SqliteConnection, "fetch", counted)
    return seen


def test_p1_on_sqlite_a_new_key_is_taken_by_its_insert_alone(
    sqlite_path: str, statements: list[str]
) -> None:
    # Under the write lock a new key needs no read first: the insert takes it, and
    # only a key that exists is read and decided (P1, P5, P6).
    with sqlite_store.SqliteStore(sqlite_path) as store:
        store.migrate()
        statements.clear()
        lease = store.claim(_request("new")).lease
        assert lease is not None
        assert statements == ["claim_read", "claim_insert"]  # the preview, then the claim
        store.release(lease)
        statements.clear()
        assert store.claim(_request("new")).outcome is Outcome.EXECUTE
        assert statements == ["claim_read", "claim_insert", "claim_read", "claim_take_over"]


def test_f3_on_sqlite_a_transactional_message_runs_its_claim_and_its_own_statement(
    sqlite_path: str, statements: list[str]
) -> None:
    insert = "INSERT INTO side_effects (note) VALUES (:note)"
    consumer = Consumer(
        name="trips",
        transactional=True,
        handler=lambda ctx: ctx.tx.execute(insert, {"note": ctx.key}),
    )
    with sqlite_store.SqliteStore(sqlite_path) as store:
        store.migrate()
        with store.transaction() as tx:
            tx.execute("CREATE TABLE side_effects (note TEXT)")
        statements.clear()
        assert process(consumer, store, Message(b"{}", message_id="m-1")).outcome == "processed"
        # The claim writes the key finished: no read, no finish.
        assert statements == ["claim_insert_finished", "application"]
