"""The store under failure: unreachable and restarted databases, busy writers, and the
connections an application hands us. The store fails closed (P11) and never answers
a wrong outcome."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from idempotence import (
    AsyncSqliteStore,
    ClaimRequest,
    Outcome,
    SchemaMissing,
    SqliteStore,
    StoredResponse,
    StoreError,
    StoreUnavailable,
    TransientError,
)
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from idempotence.stores.postgres import _store as postgres
from idempotence.stores.postgres import translate as translate_pg
from idempotence.stores.postgres._breaker import FAIL_FAST, Breaker
from tests.support.postgres import ProvidedServer, throwaway_cluster

FP = "c" * 64
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/nothing"


def req(scope: str, key: str = "k") -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint=FP)


# -- P11: unreachable ---------------------------------------------------------------------


def test_a_down_postgres_store_is_healthy_again_once_its_pool_connects(pg_url: str) -> None:
    # The breaker of a store whose server was down lets a probe through only every
    # PROBE_INTERVAL; a connection the pool makes meanwhile (an attempt in flight when
    # a partition healed) makes it healthy at once, so the next request takes it
    # instead of failing until the probe (DESIGN 13: back within 2 s of a heal).
    breaker = Breaker()
    breaker.down("the server was unreachable")
    configure = postgres._configure(
        postgres.session_settings(1.0), require_synchronous_standby=False, breaker=breaker
    )
    with psycopg.connect(pg_url, autocommit=True) as conn:
        configure(conn)
    assert not breaker.troubled
    breaker.check()  # does not raise


def test_p11_an_unreachable_postgres_fails_closed_and_fast(scope: str) -> None:
    store = PostgresStore(UNREACHABLE, connect_timeout=1)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="unavailable"):
        store.claim(req(scope))
    assert time.monotonic() - started < 5
    store.close()


def test_p11_an_unreachable_postgres_fails_closed_async(scope: str) -> None:
    async def main() -> None:
        store = AsyncPostgresStore(UNREACHABLE, connect_timeout=1)
        try:
            with pytest.raises(StoreUnavailable):
                await store.claim(req(scope))
        finally:
            await store.close()

    asyncio.run(main())


def test_p11_an_unopenable_sqlite_file_fails_closed(tmp_path: Any, scope: str) -> None:
    path = str(tmp_path / "missing-dir" / "keys.sqlite3")
    with pytest.raises(StoreUnavailable):
        SqliteStore(path).claim(req(scope))

    async def main() -> None:
        with pytest.raises(StoreUnavailable):
            await AsyncSqliteStore(path).claim(req(scope))

    asyncio.run(main())


# -- a restarted database -----------------------------------------------------------------


@pytest.fixture(scope="module")
def own_server() -> Iterator[ProvidedServer]:
    """A private cluster this module may crash and restart. Commits must be durable
    across a server crash, so synchronous_commit is back on (the throwaway default
    trades it for speed; fsync stays off, which an OS that keeps running forgives)."""
    with throwaway_cluster(settings={"synchronous_commit": "on"}) as server:
        yield server


def _settle(store: PostgresStore, request: ClaimRequest) -> Any:
    """Claim until the store answers; only StoreUnavailable may come in between."""
    for _ in range(20):
        try:
            return store.claim(request)
        except StoreUnavailable:
            time.sleep(0.1)
    raise AssertionError("the store never came back after the restart")


@pytest.mark.slow
def test_a_restarted_postgres_loses_nothing_and_answers_no_wrong_outcome(
    own_server: ProvidedServer, scope: str
) -> None:
    assert own_server.restart is not None
    store = PostgresStore(own_server.url, connect_timeout=2)
    store.migrate()
    done = store.claim(req(scope, "done")).lease
    store.finish(done, StoredResponse.of(201, body="paid"))
    running = store.claim(req(scope, "running")).lease
    assert running is not None

    own_server.restart()  # immediate stop: every pooled connection dies

    replay = _settle(store, req(scope, "done"))
    assert replay.outcome is Outcome.REPLAY
    assert replay.response.body == b"paid"
    # The lock taken before the crash is committed state: still held (P4), and its
    # holder may still finish with its lease.
    assert _settle(store, req(scope, "running")).outcome is Outcome.IN_PROGRESS
    store.finish(running, StoredResponse.of(201, body="late"))
    assert _settle(store, req(scope, "running")).response.body == b"late"
    assert _settle(store, req(scope, "new")).outcome is Outcome.EXECUTE
    store.close()


# -- transient errors are retried ---------------------------------------------------------


def _hold_write_lock(path: str, seconds: float, started: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    started.set()
    time.sleep(seconds)
    conn.execute("ROLLBACK")
    conn.close()


def test_sqlite_claims_wait_out_a_briefly_busy_writer(sqlite_path: str, scope: str) -> None:
    # busy_timeout 50 ms, another process-like writer holds the lock for 150 ms: the
    # first attempt times out (TransientError) and a retry gets through.
    started = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(sqlite_path, 0.15, started))
    holder.start()
    started.wait()
    store = SqliteStore(sqlite_path, busy_timeout=0.05)
    assert store.claim(req(scope)).outcome is Outcome.EXECUTE
    holder.join()
    store.close()


def test_sqlite_gives_up_on_a_writer_that_never_lets_go(sqlite_path: str, scope: str) -> None:
    started = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(sqlite_path, 3.0, started))
    holder.start()
    started.wait()
    store = SqliteStore(sqlite_path, busy_timeout=0.02)
    with pytest.raises(TransientError, match="busy"):
        store.claim(req(scope))
    holder.join()
    assert store.claim(req(scope)).outcome is Outcome.EXECUTE  # nothing half-done
    store.close()


# -- P6: one statement, one round trip ----------------------------------------------------


def test_p6_the_postgres_claim_is_one_statement_in_autocommit(
    pg_url: str, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, bool]] = []
    fetch = postgres.PostgresConnection.fetch

    def counting(self: Any, query: Any) -> Any:
        sent.append((query.name, self.raw.autocommit))
        return fetch(self, query)

    monkeypatch.setattr(postgres.PostgresConnection, "fetch", counting)
    store = PostgresStore(pg_url)
    first = store.claim(req(scope))
    store.claim(req(scope))  # in progress
    store.finish(first.lease, StoredResponse.of(200))
    store.claim(req(scope))  # replay
    store.close()
    # Each claim: one statement on an autocommit connection, so no BEGIN/COMMIT trips.
    assert sent == [("claim", True), ("claim", True), ("finish", True), ("claim", True)]


def test_p3_a_postgres_replay_or_mismatch_writes_nothing(pg_url: str, scope: str) -> None:
    # ON CONFLICT locks the row even when it leaves it unchanged, and a lock is a write
    # (the row's xmax) whose commit waits for a WAL flush: a replay storm would cost a
    # flush per retry. The claim skips the INSERT for a key already finished.
    def row_version(conn: psycopg.Connection[Any]) -> tuple[Any, Any]:
        found = conn.execute(
            "SELECT xmin::text, xmax::text FROM idempotency_keys WHERE scope = %s AND key = %s",
            (scope, "k"),
        ).fetchone()
        assert found is not None
        return found[0], found[1]

    with PostgresStore(pg_url) as store, psycopg.connect(pg_url, autocommit=True) as conn:
        first = store.claim(req(scope))
        assert first.lease is not None
        store.finish(first.lease, StoredResponse.of(201, body=b"done"))
        finished = row_version(conn)
        replay = store.claim(req(scope))
        mismatch = store.claim(ClaimRequest(scope=scope, key="k", fingerprint="d" * 64))
        assert (replay.outcome, mismatch.outcome) == (Outcome.REPLAY, Outcome.MISMATCH)
        assert row_version(conn) == finished  # not locked, not rewritten


def _index_reads(url: str) -> int:
    """Index entries and heap rows read from the key table so far, server-wide."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(idx_tup_fetch, 0) + seq_tup_read"
            " FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'"
        ).fetchone()
        assert row is not None
        return int(row[0])


def _grow(url: str, scope: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO idempotency_keys (scope, key, request_method, request_path,"
            " fingerprint, flow, lock_timeout)"
            " SELECT %s, 'old-' || n, 'POST', '/', 'f', 'http', '1 minute'"
            " FROM generate_series(1, %s) AS n",
            (scope, rows),
        )


@pytest.mark.slow
def test_postgres_claims_stay_on_the_key_index_as_the_table_grows(empty_pg_url: str) -> None:
    # The store's statements are prepared on its connections. A plan made while the key
    # table was empty cannot tell its two indexes apart, and one cached then looked a
    # key up by scope alone: every claim and finish read the whole scope, so claims
    # slowed down as the table grew (seen: 15 ms a claim at 6,000 keys). No ANALYZE
    # comes to the rescue here: autovacuum is off for the table, as on some servers.
    with PostgresStore(empty_pg_url) as store:
        store.migrate()
    with psycopg.connect(empty_pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE idempotency_keys SET (autovacuum_enabled = false)")

    def pairs(store: PostgresStore, keys: range) -> None:
        for n in keys:
            claim = store.claim(req("grow", f"k{n}"))
            assert claim.lease is not None
            store.finish(claim.lease, StoredResponse.of(201, body=b"ok"))
        with store.transaction() as tx:  # report this backend's counters now
            tx.execute("SELECT pg_stat_force_next_flush()")

    async def pairs_async(store: AsyncPostgresStore, keys: range) -> None:
        for n in keys:
            claim = await store.claim(req("grow-async", f"k{n}"))
            assert claim.lease is not None
            await store.finish(claim.lease, StoredResponse.of(201, body=b"ok"))
        async with store.transaction() as tx:
            await tx.execute("SELECT pg_stat_force_next_flush()")

    async def run_async() -> int:
        async with AsyncPostgresStore(empty_pg_url, max_size=1) as store:
            await pairs_async(store, range(10))  # prepared, on an empty table
            _grow(empty_pg_url, "grow-async", 20_000)
            before = _index_reads(empty_pg_url)
            await pairs_async(store, range(10, 30))
            return _index_reads(empty_pg_url) - before

    with PostgresStore(empty_pg_url, max_size=1) as store:
        pairs(store, range(10))
        _grow(empty_pg_url, "grow", 20_000)
        before = _index_reads(empty_pg_url)
        pairs(store, range(10, 30))
        sync_reads = _index_reads(empty_pg_url) - before
    async_reads = asyncio.run(run_async())
    # A claim and a finish read a handful of rows each; a scan of the scope, 20,000.
    assert max(sync_reads, async_reads) < 20 * 50, (sync_reads, async_reads)


# -- connections the application already has -------------------------------------------


def test_postgres_store_on_the_applications_own_connection(pg_url: str, scope: str) -> None:
    conn = psycopg.connect(pg_url)  # not autocommit: the store must commit its own work
    store = PostgresStore(conn)
    claim = store.claim(req(scope))
    assert claim.outcome is Outcome.EXECUTE
    with PostgresStore(pg_url) as other:  # committed, so visible elsewhere
        assert other.claim(req(scope)).outcome is Outcome.IN_PROGRESS
    with store.transaction() as tx:
        tx.execute("SELECT 1")
        store.finish(claim.lease, StoredResponse.of(200, body="own"), tx=tx)
    with PostgresStore(pg_url) as other:
        assert other.claim(req(scope)).response.body == b"own"
    conn.close()


def test_async_postgres_store_on_the_applications_own_connection(pg_url: str, scope: str) -> None:
    async def main() -> None:
        conn = await psycopg.AsyncConnection.connect(pg_url)
        store = AsyncPostgresStore(conn)
        claim = await store.claim(req(scope))
        async with store.transaction() as tx:
            await store.checkpoint(tx, claim.lease, "step")
        assert (await store.get(scope, "k")).recovery_point == "step"
        await conn.close()

    asyncio.run(main())


def test_sqlite_store_on_the_applications_own_connection(sqlite_path: str, scope: str) -> None:
    conn = sqlite3.connect(sqlite_path)  # Python's default implicit-transaction mode
    store = SqliteStore(conn)
    claim = store.claim(req(scope))
    store.finish(claim.lease, StoredResponse.of(200, body="own"))
    with SqliteStore(sqlite_path) as other:
        assert other.claim(req(scope)).response.body == b"own"
    conn.close()


def test_sqlite_replays_are_served_while_a_writer_holds_the_lock(
    sqlite_path: str, scope: str
) -> None:
    """P3 needs no write: a replay (or a mismatch, or a conflict) is decided by a read,
    so a long write transaction elsewhere does not hold it up."""
    store = SqliteStore(sqlite_path, busy_timeout=0.02)
    store.finish(store.claim(req(scope)).lease, StoredResponse.of(201, body="paid"))
    started = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(sqlite_path, 1.0, started))
    holder.start()
    started.wait()
    began = time.monotonic()
    assert store.claim(req(scope)).response.body == b"paid"
    assert store.claim(ClaimRequest(scope=scope, key="k", fingerprint="x")).outcome is (
        Outcome.MISMATCH
    )
    assert time.monotonic() - began < 0.5
    holder.join()
    store.close()


# -- the application's own statements ------------------------------------------------------


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_a_missing_application_table_is_the_applications_error_not_the_schema(
    backend: str, pg_url: str, sqlite_path: str, scope: str
) -> None:
    """#16: the application's INSERT into a table of its own that does not exist, in a
    request-as-transaction phase, is its error: not the key store's schema missing,
    with advice to run ``idempotence migrate`` that would not help."""
    store: Any = PostgresStore(pg_url) if backend == "postgres" else SqliteStore(sqlite_path)
    if backend == "sqlite":
        store.migrate()
    with store, pytest.raises(StoreError) as raised, store.transaction(claim=req(scope)) as tx:
        assert tx.claim is not None and tx.claim.outcome is Outcome.EXECUTE
        tx.execute("INSERT INTO app_rides_that_do_not_exist (id) VALUES (1)")
    assert not isinstance(raised.value, SchemaMissing)
    assert "migrate" not in str(raised.value)
    assert "app_rides_that_do_not_exist" in str(raised.value)
    # The key store's own schema missing still says to migrate.
    assert "migrate" in str(translate_pg(psycopg.errors.UndefinedTable("no relation")))


def test_a_missing_application_table_is_the_applications_error_async(
    pg_url: str, scope: str
) -> None:
    async def main() -> None:
        async with AsyncPostgresStore(pg_url) as store:
            with pytest.raises(StoreError) as raised:
                async with store.transaction(claim=req(scope)) as tx:
                    await tx.execute("SELECT no_such_column FROM idempotency_keys")
            assert not isinstance(raised.value, SchemaMissing)
            assert "migrate" not in str(raised.value)

    asyncio.run(main())


def test_p11_a_pooled_connection_with_a_notification_waiting_is_kept(
    pg_url: str, scope: str
) -> None:
    """The restart check drops a pooled connection whose socket has something to
    read while idle (the server closed it); one of an application's pool that LISTENs
    has a notification to read, and is alive: a round trip tells, and it stays."""
    import psycopg_pool

    with psycopg_pool.ConnectionPool(pg_url, min_size=1, max_size=1, open=True) as pool:
        with pool.connection() as conn:
            conn.execute("LISTEN idempotence_test_channel")
            conn.commit()
            backend = conn.info.backend_pid
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("NOTIFY idempotence_test_channel")
        time.sleep(0.2)  # the notification reaches the idle connection's socket
        store = PostgresStore(pool)
        assert store.claim(req(scope)).outcome is Outcome.EXECUTE
        with pool.connection() as conn:
            assert conn.info.backend_pid == backend


# -- P11: a busy pool serves its waiters in order ------------------------------------------
#
# A checkout waits for a connection in slices (so that it notices a server gone away);
# a slice that ran out used to rejoin the pool's queue at the back, behind every later
# checkout: in a burst, the first request could wait longest and time out while later
# ones got through. The timeline, in slices: the pool's one connection is held; the
# first waits from 0 (and used to rejoin the queue at 1 and 2); the second comes at 1.6
# (and used to rejoin at 2.6); the connection is back at 2.3, when the first used to
# be behind the second.

FIRST_WAITER_AT, SECOND_WAITER_AT, RELEASED_AT = 0.0, 1.6 * FAIL_FAST, 2.3 * FAIL_FAST


def test_p11_a_busy_pools_waiters_are_served_in_order(pg_url: str, scope: str) -> None:
    import psycopg_pool

    with psycopg_pool.ConnectionPool(
        pg_url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=True
    ) as pool:
        store = PostgresStore(pool)
        served: list[str] = []

        def read(key: str) -> None:
            store.get(scope, key)  # a read: nothing batches it
            served.append(key)

        held = pool.getconn()
        started = time.monotonic()
        first = threading.Thread(target=read, args=("first",))
        first.start()
        time.sleep(SECOND_WAITER_AT - (time.monotonic() - started))
        second = threading.Thread(target=read, args=("second",))
        second.start()
        time.sleep(RELEASED_AT - (time.monotonic() - started))
        pool.putconn(held)
        first.join(10)
        second.join(10)
        assert served == ["first", "second"]


def test_p11_a_busy_pools_waiters_are_served_in_order_async(pg_url: str, scope: str) -> None:
    import psycopg_pool

    async def main() -> None:
        async with psycopg_pool.AsyncConnectionPool(
            pg_url, min_size=1, max_size=1, kwargs={"autocommit": True}
        ) as pool:
            store = AsyncPostgresStore(pool)
            served: list[str] = []

            async def read(key: str, at: float) -> None:
                await asyncio.sleep(at)
                await store.get(scope, key)  # a read: nothing batches it
                served.append(key)

            held = await pool.getconn()
            waiters = asyncio.gather(
                read("first", FIRST_WAITER_AT), read("second", SECOND_WAITER_AT)
            )
            await asyncio.sleep(RELEASED_AT)
            await pool.putconn(held)
            await asyncio.wait_for(waiters, 10)
            assert served == ["first", "second"]

    asyncio.run(main())


def test_p11_a_checkout_waiting_for_its_turn_still_gives_up_at_the_pools_timeout(
    pg_url: str, scope: str
) -> None:
    """The second of two waiters on an exhausted pool waits for its turn, and fails
    closed (503's error) within the pool's timeout, as the first does."""
    import psycopg_pool

    with psycopg_pool.ConnectionPool(
        pg_url, min_size=1, max_size=1, timeout=0.8, kwargs={"autocommit": True}, open=True
    ) as pool:
        store = PostgresStore(pool)
        held = pool.getconn()
        outcomes: list[tuple[str, float]] = []

        def read() -> None:
            started = time.monotonic()
            try:
                store.get(scope, "k")
                outcomes.append(("read", time.monotonic() - started))
            except StoreUnavailable as exc:
                outcomes.append((str(exc).split(":")[0], time.monotonic() - started))

        threads = [threading.Thread(target=read) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        pool.putconn(held)
        unavailable = "PostgreSQL is unavailable"
        assert [what for what, _ in outcomes] == [unavailable, unavailable]
        assert all(seconds < 0.8 + 0.5 for _, seconds in outcomes), outcomes
