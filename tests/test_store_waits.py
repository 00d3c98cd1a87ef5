"""P10 on the stores: a duplicate waits for its twin with ``store.wait_for_settle``.

Every store bounds the wait by the caller's pause (SQLite sleeps it: bounded
polling). PostgreSQL ends it early with LISTEN/NOTIFY: a waiter marks the key, and the
statement that settles it (finish, release, forget) sends one NOTIFY, only then. The
notifications are watched here on a psycopg connection of the test's own; times are
measured with wide margins (behaviour, not a benchmark).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from idempotence import ClaimRequest, StoredResponse
from idempotence.stores._listener_shared import APPLICATION_NAME
from idempotence.stores._waiters import parse
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from tests.support.stores import Blocking, EventLoopThread

CHANNEL = "idempotence_settled"
LONG = 10.0  # a wait that only a notification can end well before its bound


def request(scope: str, key: str) -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint="a" * 64, lock_timeout=timedelta(hours=1))


def response() -> StoredResponse:
    return StoredResponse.of(201, {"content-type": "text/plain"}, "from-twin")


def hold(store: Any, scope: str, key: str) -> Any:
    claim = store.claim(request(scope, key))
    assert claim.lease is not None, claim
    return claim.lease


@dataclass
class Waiting:
    """``store.wait_for_settle`` running on a thread of its own."""

    elapsed: float | None = None
    error: BaseException | None = None
    thread: threading.Thread = field(init=False)

    def join(self, timeout: float = 60) -> float:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the wait did not end"
        if self.error is not None:
            raise self.error
        assert self.elapsed is not None
        return self.elapsed


def start_waiting(store: Any, scope: str, key: str, seconds: float) -> Waiting:
    waiting = Waiting()

    def run() -> None:
        started = time.monotonic()
        try:
            store.wait_for_settle(scope, key, seconds)
        except BaseException as exc:
            waiting.error = exc
        waiting.elapsed = time.monotonic() - started

    waiting.thread = threading.Thread(target=run, daemon=True)
    waiting.thread.start()
    return waiting


def waiters_flag(url: str, scope: str, key: str) -> bool | None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT waiters FROM idempotency_keys WHERE scope = %s AND key = %s", (scope, key)
        ).fetchone()
    return None if row is None else bool(row[0])


def until(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.01)


def wait_marked(url: str, scope: str, key: str) -> None:
    until(lambda: waiters_flag(url, scope, key) is True, f"{key!r} is marked as waited for")


@contextmanager
def watching(url: str) -> Iterator[Callable[[str, float], list[tuple[str, str] | None]]]:
    """A connection LISTENing on the store's channel, as any other client could."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")

        def received(scope: str, within: float) -> list[tuple[str, str] | None]:
            """The notifications naming ``scope`` that arrive in ``within`` seconds."""
            got = [parse(n.payload) for n in conn.notifies(timeout=within)]
            return [named for named in got if named is None or named[0] == scope]

        yield received


def listener_pids(url: str) -> list[int]:
    dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (dbname, APPLICATION_NAME),
        ).fetchall()
    return [pid for (pid,) in rows]


@pytest.fixture(params=["sync", "async"])
def open_pg(
    request: pytest.FixtureRequest, pg_url: str, loop_thread: EventLoopThread
) -> Iterator[Callable[[], Any]]:
    """Opens PostgreSQL stores of the flavour under test (async ones behind a sync face),
    closing them at the end."""
    opened: list[Any] = []

    def open_store() -> Any:
        store: Any = (
            PostgresStore(pg_url)
            if request.param == "sync"
            else Blocking(AsyncPostgresStore(pg_url), loop_thread)
        )
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


@pytest.fixture
def pg_store(open_pg: Callable[[], Any]) -> Any:
    return open_pg()


# -- every store: the wait is bounded -----------------------------------------------------


def test_p10_every_store_waits_at_most_its_bound(store: Any, scope: str) -> None:
    hold(store, scope, "held")
    started = time.monotonic()
    store.wait_for_settle(scope, "held", 0.2)
    assert 0.15 <= time.monotonic() - started < 3


# -- PostgreSQL: NOTIFY only for waiters, and it wakes them --------------------------------


def test_p10_a_finish_nobody_waits_for_sends_no_notification(
    pg_store: Any, pg_url: str, scope: str
) -> None:
    lease = hold(pg_store, scope, "alone")
    with watching(pg_url) as received:
        pg_store.finish(lease, response())
        assert received(scope, 0.5) == []
    assert waiters_flag(pg_url, scope, "alone") is False


@pytest.mark.parametrize("settle", ["finish", "release", "forget"])
def test_p10_settling_a_key_wakes_its_waiter_with_one_notification(
    pg_store: Any, pg_url: str, scope: str, settle: str
) -> None:
    lease = hold(pg_store, scope, "twin")
    with watching(pg_url) as received:
        waiting = start_waiting(pg_store, scope, "twin", LONG)
        wait_marked(pg_url, scope, "twin")
        time.sleep(0.2)  # the waiter is asleep, not about to return
        if settle == "finish":
            pg_store.finish(lease, response())
        elif settle == "release":
            pg_store.release(lease)
        else:
            pg_store.forget(lease)
        assert waiting.join() < LONG / 2
        assert received(scope, 0.5) == [(scope, "twin")]
    # The mark is cleared (or gone with the row): a later settle sends nothing.
    assert waiters_flag(pg_url, scope, "twin") in (False, None)


def test_p10_f3_a_claim_that_takes_a_key_over_finished_wakes_its_waiter_at_the_commit(
    pg_store: Any, pg_url: str, scope: str
) -> None:
    # A transactional consumer's claim writes the key finished (claim_finished): when
    # it takes over a key whose lock expired, the duplicates waiting for that key are
    # woken as a finish would wake them, once the transaction commits.
    short = ClaimRequest(
        scope=scope, key="lapsed", fingerprint="a" * 64, lock_timeout=timedelta(seconds=1)
    )
    assert pg_store.claim(short).lease is not None
    with watching(pg_url) as received:
        waiting = start_waiting(pg_store, scope, "lapsed", LONG)
        wait_marked(pg_url, scope, "lapsed")
        time.sleep(1.2)  # the lock lapses; the waiter sleeps on
        with pg_store.transaction(claim=request(scope, "lapsed"), finished=response()) as tx:
            assert tx.claim.lease is not None and tx.claim.lease.token == 2
            assert received(scope, 0.3) == []  # not before the COMMIT
        assert waiting.join() < LONG / 2
        assert received(scope, 0.5) == [(scope, "lapsed")]
    assert waiters_flag(pg_url, scope, "lapsed") is False


def test_p10_a_second_settle_without_waiters_sends_nothing(
    pg_store: Any, pg_url: str, scope: str
) -> None:
    """release clears the mark: the next holder's finish sends no NOTIFY for nobody."""
    lease = hold(pg_store, scope, "again")
    waiting = start_waiting(pg_store, scope, "again", LONG)
    wait_marked(pg_url, scope, "again")
    pg_store.release(lease)
    assert waiting.join() < LONG / 2
    second = hold(pg_store, scope, "again")
    with watching(pg_url) as received:
        pg_store.finish(second, response())
        assert received(scope, 0.5) == []


def test_p10_several_waiters_of_one_key_all_wake(pg_store: Any, pg_url: str, scope: str) -> None:
    lease = hold(pg_store, scope, "crowd")
    waitings = [start_waiting(pg_store, scope, "crowd", LONG) for _ in range(3)]
    wait_marked(pg_url, scope, "crowd")
    time.sleep(0.3)  # all three have marked and sleep
    pg_store.finish(lease, response())
    assert all(waiting.join() < LONG / 2 for waiting in waitings)


def test_p10_a_waiter_on_a_settled_or_unknown_key_returns_at_once(
    pg_store: Any, scope: str
) -> None:
    lease = hold(pg_store, scope, "done")
    pg_store.finish(lease, response())
    for key in ("done", "never-claimed"):
        started = time.monotonic()
        pg_store.wait_for_settle(scope, key, LONG)
        assert time.monotonic() - started < LONG / 2


def test_p10_another_keys_settle_does_not_end_the_wait(
    pg_store: Any, pg_url: str, scope: str
) -> None:
    hold(pg_store, scope, "mine")
    other = hold(pg_store, scope, "other")
    other_waiting = start_waiting(pg_store, scope, "other", LONG)
    wait_marked(pg_url, scope, "other")
    started = time.monotonic()
    waiting = start_waiting(pg_store, scope, "mine", 1.0)
    wait_marked(pg_url, scope, "mine")
    pg_store.finish(other, response())
    assert other_waiting.join() < LONG / 2
    assert waiting.join() >= 0.9
    assert time.monotonic() - started >= 0.9


def test_p10_a_scope_too_long_for_a_payload_polls_and_never_fails_a_finish(
    pg_store: Any, pg_url: str, scope: str
) -> None:
    """NOTIFY refuses payloads of 8000 bytes: such a waiter just sleeps its bound, and
    a settle of a marked key with such a scope still succeeds (no NOTIFY)."""
    scope += "s" * 8000  # compresses well enough for the unique index
    lease = hold(pg_store, scope, "long")
    started = time.monotonic()
    pg_store.wait_for_settle(scope, "long", 0.3)
    assert 0.25 <= time.monotonic() - started < 3
    assert waiters_flag(pg_url, scope, "long") is False  # it never asked for a NOTIFY
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE idempotency_keys SET waiters = true WHERE scope = %s AND key = %s",
            (scope, "long"),
        )
    with watching(pg_url) as received:
        pg_store.finish(lease, response())
        assert received(scope, 0.3) == []
    record = pg_store.get(scope, "long")
    assert record is not None and record.finished


# -- the listener connection ----------------------------------------------------------------


def test_p10_the_listener_is_one_connection_opened_at_the_first_wait_and_closed_with_the_store(
    open_pg: Callable[[], Any], pg_url: str, scope: str
) -> None:
    before = set(listener_pids(pg_url))
    store = open_pg()
    hold(store, scope, "k")
    assert set(listener_pids(pg_url)) == before  # none until someone waits
    for _ in range(3):
        store.wait_for_settle(scope, "k", 0.05)
    ours = set(listener_pids(pg_url)) - before
    assert len(ours) == 1
    store.close()
    until(lambda: not ours & set(listener_pids(pg_url)), "the listener connection closed")


def test_p10_a_killed_listener_costs_a_wait_its_bound_and_the_next_wait_reconnects(
    pg_store: Any, pg_url: str, scope: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="idempotence.stores")
    before = set(listener_pids(pg_url))
    lease = hold(pg_store, scope, "cut")
    waiting = start_waiting(pg_store, scope, "cut", 1.5)
    wait_marked(pg_url, scope, "cut")
    ours = set(listener_pids(pg_url)) - before
    assert len(ours) == 1
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (ours.pop(),))
    until(lambda: "listener connection failed" in caplog.text, "the failure is logged")
    pg_store.finish(lease, response())  # its NOTIFY reaches nobody
    assert 1.3 <= waiting.join() < 5  # the wait ended by its bound: polling

    lease = hold(pg_store, scope, "after")
    waiting = start_waiting(pg_store, scope, "after", LONG)
    wait_marked(pg_url, scope, "after")
    assert len(set(listener_pids(pg_url)) - before) == 1  # reconnected
    time.sleep(0.2)
    pg_store.finish(lease, response())
    assert waiting.join() < LONG / 2
