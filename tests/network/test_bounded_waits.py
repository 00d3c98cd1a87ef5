"""No unbounded wait on the request path (DESIGN 13): a statement that cannot complete
fails closed with StoreUnavailable within the store's stated bound, in every store.

Faults here need no namespace: a session that holds the key row's lock (PostgreSQL),
a server that accepts connections and never answers (Redis), a writer that holds the
database (SQLite). The partition mid-query is in test_partitions.py.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from idempotence.errors import ConfigurationError, StoreError, StoreUnavailable
from idempotence.states import ClaimRequest, StoredResponse
from idempotence.stores.postgres import PostgresStore
from idempotence.stores.postgres._watchdog import GRACE
from idempotence.stores.redis import RedisStore
from idempotence.stores.sqlite import SqliteStore
from tests.support.postgres import throwaway_cluster

BOUND = 1.0
#: Slack on top of a bound for the machine's load (2 cores shared by many runs).
SLACK = 2.0


def request(key: str) -> ClaimRequest:
    return ClaimRequest(scope="bounded", key=key, fingerprint="f" * 64)


def finish_behind_a_stuck_session(
    url: str, statement_timeout: float | None, key: str
) -> float | BaseException:
    """Claim ``key``, let another session lock its row, and finish; the time the finish
    took to fail, or what it raised (run in a thread by the caller)."""
    with PostgresStore(url, statement_timeout=statement_timeout) as store:
        lease = store.claim(request(key)).lease
        assert lease is not None
        with psycopg.connect(url) as stuck:
            # A session that took the row and stopped (an operator's open transaction).
            stuck.execute("SELECT 1 FROM idempotency_keys WHERE key = %s FOR UPDATE", (key,))
            started = time.monotonic()
            try:
                store.finish(lease, StoredResponse.of(201, body=b"ok"))
            except StoreError as exc:
                if not isinstance(exc, StoreUnavailable):
                    return exc
                return time.monotonic() - started
            finally:
                with contextlib.suppress(psycopg.Error):
                    stuck.rollback()
    return AssertionError("the finish completed behind a session holding the row lock")


def in_thread(
    url: str, statement_timeout: float | None, key: str
) -> tuple[threading.Thread, list[object]]:
    results: list[object] = []

    def run() -> None:
        try:
            results.append(finish_behind_a_stuck_session(url, statement_timeout, key))
        except BaseException as exc:  # reported by the test, not by the thread
            results.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results


def free_stuck_sessions(url: str) -> None:
    """End the holding session from the server side (a hung test must not hang on)."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE '%FOR UPDATE' "
            "AND pid <> pg_backend_pid()"
        )


def test_postgres_finish_behind_a_stuck_session_fails_closed_within_the_bound(
    fresh_pg_url: str,
) -> None:
    thread, results = in_thread(fresh_pg_url, BOUND, "stuck-1")
    thread.join(timeout=BOUND + SLACK + 3)  # the claim and connects, on a busy machine
    if thread.is_alive():
        free_stuck_sessions(fresh_pg_url)
        thread.join(timeout=10)
        pytest.fail(f"the finish was still waiting after {BOUND + SLACK + 3:g} s")
    (took,) = results
    assert isinstance(took, float), took
    assert BOUND * 0.8 <= took <= BOUND + SLACK


def test_postgres_without_a_bound_the_finish_waits_for_the_stuck_session(fresh_pg_url: str) -> None:
    # The control: with no bound (the store before DESIGN 13), the finish waits as
    # long as the session holds the lock. We wait 2.5 s, bounded, then free it.
    thread, results = in_thread(fresh_pg_url, None, "stuck-2")
    thread.join(timeout=2.5)
    alive, early = thread.is_alive(), list(results)
    free_stuck_sessions(fresh_pg_url)
    thread.join(timeout=10)
    assert alive and not early, f"the finish returned without a bound: {early}"
    assert not thread.is_alive()


def test_postgres_a_commit_no_synchronous_standby_confirms_is_never_reported_done() -> None:
    """A server that names a synchronous standby that is not there: every COMMIT
    waits for it. The watchdog cancels the wait past the bound; the server then keeps
    the commit on the primary alone, without an error, and the store reports the
    claim failed (503): a failover to a standby would lose it."""
    with throwaway_cluster() as server:
        with PostgresStore(server.url) as store:
            store.migrate()
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'ghost'")
            admin.execute("ALTER SYSTEM SET synchronous_commit = 'on'")  # a fast cluster's: off
            admin.execute("SELECT pg_reload_conf()")
        with PostgresStore(server.url, statement_timeout=BOUND) as store:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="no synchronous standby confirmed it"):
                store.claim(request("k"))
            assert time.monotonic() - started < BOUND + GRACE + SLACK
        with psycopg.connect(server.url) as conn:  # it did commit, on the primary alone
            assert conn.execute("SELECT count(*) FROM idempotency_keys").fetchone() == (1,)


@pytest.mark.parametrize("bad", [0, -1.0, "5", True, float("nan")])
def test_a_statement_timeout_that_is_no_positive_number_is_refused(
    fresh_pg_url: str, bad: object
) -> None:
    with pytest.raises(
        ConfigurationError, match="statement_timeout is a positive number of seconds"
    ):
        PostgresStore(fresh_pg_url, statement_timeout=bad)  # type: ignore[arg-type]


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server that accepts connections and never answers (a stuck server)."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        for sock in accepted:
            sock.close()
        server.close()


def test_redis_that_stopped_answering_fails_closed_within_the_timeout(silent_server: int) -> None:
    with RedisStore(f"redis://127.0.0.1:{silent_server}/0", timeout=0.5) as store:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.claim(request("silent"))
        assert time.monotonic() - started <= 0.5 + SLACK


def test_sqlite_behind_a_held_writer_fails_closed_within_the_busy_timeout(tmp_path: object) -> None:
    path = f"{tmp_path}/keys.sqlite3"
    with SqliteStore(path, busy_timeout=0.2) as store:
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # a writer that does not finish
            started = time.monotonic()
            with pytest.raises(StoreError) as raised:
                store.claim(request("held"))
            took = time.monotonic() - started
        finally:
            holder.rollback()
            holder.close()
    # The store retries a busy database a few times (TRANSIENT_ATTEMPTS), each
    # attempt bounded by busy_timeout.
    assert took <= 5 * 0.2 + SLACK, took
    from idempotence.http._responses import DOWN

    assert isinstance(raised.value, DOWN), f"{type(raised.value).__name__} would not be a 503"
