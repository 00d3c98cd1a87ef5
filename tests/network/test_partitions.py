"""Partitions at every boundary of a guarded request (DESIGN 13; issue 35 items 1, 3, 6).

The app server runs in its own network namespace (hosts.py) and reaches PostgreSQL
over a veth link through a relay that adds latency, so the test can cut the link while
a given statement is in flight: the claim, the handler's work, the finish or the
request-as-transaction COMMIT. While the link is down the client keeps asking; after
it heals the client retries to a final answer. The history checker then judges the
run: one effect per key, the acknowledged answer replayed, the store's record finished
with it, the key settled within the lock timeout plus a heartbeat interval (plus the
time a cut-off statement takes to fail) of the heal, and no retry told 409 by its own
lost attempt for longer than that.

These tests need root (network namespaces): without it they fail and say so.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from idempotence.states import KeyRecord
from idempotence.stores.postgres import PostgresStore
from idempotence.stores.redis import RedisStore
from idempotence.testing import History, HistoryReport
from tests.support.polling import eventually

from .hosts import AppHost, Link, Relay

#: The app's lock timeout and statement bound (seconds), short so a test is quick.
LOCK = 2.0
BOUND = 1.0
#: How long a statement cut off by the partition takes to fail: tcp_user_timeout and
#: keepalives (about the bound, the first probe after at least a second), plus slack
#: for a machine shared by many test runs.
FAIL_WITHIN = BOUND + 4.0
#: A key settles within the lock timeout plus a heartbeat interval of the heal (the
#: lock of the cut-off attempt lapses), plus the time a retry's own cut-off statement
#: may still take, plus the client's pause between retries.
SETTLE = LOCK + LOCK / 3 + FAIL_WITHIN + 1.0
RELAY_DELAY = 0.6
#: On the Redis link: a command's round trip through the relay (twice the delay) must
#: stay under the Redis store's timeout (the bound), or every command times out.
REDIS_RELAY_DELAY = 0.3


@dataclass
class Served:
    host: AppHost
    relay: Relay | None
    """The relay on the store's link (to PostgreSQL, or to Redis for the Redis store);
    None: the app reaches its database directly (AppHost.database)."""
    url: str
    database: str | None
    """PostgreSQL on this machine (None for the Redis store)."""
    provider: Path
    kind: str = "postgres"
    """The app's store: ``postgres``, ``redis`` or ``cached`` (app.py's NET_STORE)."""
    redis: tuple[str, str] | None = None
    """The Redis of the Redis store or of the cache, on this machine, and its prefix."""
    cache_relay: Relay | None = None
    """The cached store's relay to its Redis, on the cache link."""

    @property
    def delay(self) -> float:
        """The relay's latency while a test places a cut on a statement in flight."""
        return REDIS_RELAY_DELAY if self.kind == "redis" else RELAY_DELAY

    def effects(self, history: History) -> None:
        """Record the effects that landed: the provider's charges, the transfer rows."""
        with sqlite3.connect(self.provider) as db:
            db.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, id TEXT)")
            for key, charge_id in db.execute("SELECT key, id FROM charges"):
                # net-KEY-charge, or net-KEY-charge-ROW (app.py's NET_CHARGE_BY=row)
                history.effect(key.removeprefix("net-").partition("-charge")[0], charge_id)
        if self.database is not None:
            with psycopg.connect(self.database) as conn:
                for key, transfer_id in conn.execute("SELECT key, id FROM net_transfers"):
                    history.effect(key, transfer_id)

    def records(self, keys: list[str]) -> dict[str, KeyRecord | None]:
        """The store's record of each key: the Redis store's, or PostgreSQL's (the
        cached store's primary is the truth)."""
        store: Any
        if self.kind == "redis":
            assert self.redis is not None
            store = RedisStore(self.redis[0], prefix=self.redis[1])
        else:
            assert self.database is not None
            store = PostgresStore(self.database)
        with store:
            return {key: store.get("default", key) for key in keys}

    def runs(self, key: str) -> int:
        """How many times the handler of ``/charges`` ran for ``key``."""
        with sqlite3.connect(self.provider) as db:
            db.execute("CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL)")
            (count,) = db.execute("SELECT count(*) FROM runs WHERE key = ?", (key,)).fetchone()
        return int(count)

    def charged(self, key: str) -> bool:
        with sqlite3.connect(self.provider) as db:
            db.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, id TEXT)")
            return (
                db.execute("SELECT 1 FROM charges WHERE key = ?", (f"net-{key}-charge",)).fetchone()
                is not None
            )

    def check(self, history: History, keys: list[str], healed_at: float) -> HistoryReport:
        self.effects(history)
        records = self.records(keys)
        return history.check(records=records, healed_at=healed_at, settle_within=SETTLE)


@pytest.fixture
def served(app_host: AppHost, fresh_pg_url: str, tmp_path: Path) -> Served:
    return serve(app_host, fresh_pg_url, tmp_path, LOCK)


def over(relay: Relay, url: str) -> str:
    """``url`` with the relay's address in place of its host and port."""
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    host, port = relay.address
    return urlunsplit(parts._replace(netloc=f"{user}{host}:{port}"))


def relayed(app_host: AppHost, url: str, default_port: int, link: Link | None = None) -> Relay:
    parts = urlsplit(url)
    return app_host.relay((parts.hostname or "127.0.0.1", parts.port or default_port), link)


def serve(
    app_host: AppHost,
    database: str | None,
    tmp_path: Path,
    lock: float,
    *,
    kind: str = "postgres",
    redis: tuple[str, str] | None = None,
) -> Served:
    """The app (app.py) in ``app_host`` with a lock timeout of ``lock`` seconds, on
    the ``kind`` store: PostgreSQL (``database``) through a relay on the back link, or
    the Redis store (``redis``: its URL and key prefix) through one, or PostgreSQL
    with the Redis cache through a relay on the cache link."""
    env = {
        "NET_STORE": kind,
        "NET_LOCK_TIMEOUT": str(lock),
        "NET_STATEMENT_TIMEOUT": os.environ.get("NET_TEST_UNBOUNDED", str(BOUND)),
    }
    relay = cache_relay = None
    if database is not None:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("CREATE TABLE net_transfers (key TEXT NOT NULL, id TEXT NOT NULL)")
        relay = relayed(app_host, database, 5432)
        env["NET_DATABASE_URL"] = over(relay, database)
    if redis is not None:
        if kind == "redis":
            relay = relayed(app_host, redis[0], 6379)
            env["NET_REDIS_URL"] = over(relay, redis[0])
        else:
            assert app_host.cache is not None, "a cached store needs AppHost.create(cache=True)"
            cache_relay = relayed(app_host, redis[0], 6379, app_host.cache)
            env["NET_REDIS_URL"] = over(cache_relay, redis[0])
        env["NET_REDIS_PREFIX"] = redis[1]
    provider = tmp_path / "provider.sqlite3"
    env["NET_PROVIDER"] = str(provider)
    url = app_host.serve("tests.network.app:app", env)
    return Served(app_host, relay, url, database, provider, kind, redis, cache_relay)


def attempt(
    history: History, client: httpx.Client, path: str, key: str, work: float = 0.0
) -> int | None:
    with history.operation(key) as op:
        try:
            response = client.post(
                path, headers={"Idempotency-Key": key, "x-work": str(work)}, json={}
            )
        except httpx.HTTPError:
            return None
        op.answer(response.status_code, response.content)
    return op.status


def retry_to_final(
    history: History, client: httpx.Client, path: str, key: str, seconds: float
) -> None:
    """Retry until a final answer, at most ``seconds`` (bounded in count too)."""
    deadline = time.monotonic() + seconds
    for _ in range(200):
        status = attempt(history, client, path, key)
        if status is not None and status < 500 and status != 409:
            return
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)


def partition_at(
    served: Served, path: str, key: str, *, boundary: str
) -> tuple[History, list[tuple[int | None, float]], float, float]:
    """Send one request, cut the back link at ``boundary``, ask during the cut, heal,
    retry. Returns the history, the answers during the cut (with their durations),
    the cut's time and the heal's (the history's clock)."""
    history = History()
    during: list[tuple[int | None, float]] = []
    with httpx.Client(base_url=served.url, timeout=FAIL_WITHIN + 5) as client:
        # Warm: the pool's connection is open before the latency goes on.
        assert attempt(history, client, path, f"{key}-warm") == 201
        served.relay.delay = served.delay
        work = 2.0 if boundary == "handler" else 0.3
        first = threading.Thread(target=attempt, args=(history, client, path, key, work))
        first.start()
        if boundary == "claim":
            # The claim left the app and sits in the relay's delay.
            time.sleep(served.delay / 2)
        elif path == "/charges":
            eventually(lambda: served.charged(key), "the charge", timeout=10)
            if boundary == "finish":
                # The handler's work is over and its finish sits in the relay.
                time.sleep(work + served.delay / 2)
        else:
            # A transfer's row is invisible until its COMMIT: wait for the claim and
            # the INSERT to make their way (two delayed round trips), then the work.
            delay = served.delay
            time.sleep(4 * delay + (work + delay / 2 if boundary == "finish" else 0.2))
        with served.host.back.partitioned():
            cut = history.now()
            # Ask while the link is down: each answer must come within the bound.
            while time.monotonic() - cut < LOCK * 1.5:
                started = time.monotonic()
                status = attempt(history, client, path, key)
                during.append((status, time.monotonic() - started))
                time.sleep(0.05)
        healed_at = history.now()
        served.relay.delay = 0.0
        first.join(timeout=FAIL_WITHIN + 10)
        assert not first.is_alive(), "the first attempt never got an answer"
        retry_to_final(history, client, path, key, SETTLE + 10)
    return history, during, cut, healed_at


BOUNDARIES = [
    pytest.param("/charges", "claim", id="handler-claim"),
    pytest.param("/transfers", "finish", id="transaction-commit"),
    pytest.param("/charges", "handler", id="handler-during", marks=pytest.mark.slow),
    pytest.param("/charges", "finish", id="handler-finish", marks=pytest.mark.slow),
    pytest.param("/transfers", "claim", id="transaction-claim", marks=pytest.mark.slow),
    pytest.param("/transfers", "handler", id="transaction-during", marks=pytest.mark.slow),
    pytest.param("/rides", "claim", id="flow-claim", marks=pytest.mark.slow),
    pytest.param("/rides", "handler", id="flow-phase", marks=pytest.mark.slow),
    pytest.param("/rides", "finish", id="flow-commit", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("path", "boundary"), BOUNDARIES)
def test_a_partition_at_each_boundary_keeps_every_promise(
    served: Served, path: str, boundary: str
) -> None:
    keeps_every_promise(served, path, boundary)


def keeps_every_promise(served: Served, path: str, boundary: str) -> None:
    """The body of the test above, on any store the app can run (``served``)."""
    key = f"part-{boundary}"
    history, during, cut, healed_at = partition_at(served, path, key, boundary=boundary)
    report = served.check(history, [key, f"{key}-warm"], healed_at)
    first = next(op for op in history.operations if op.key == key and op.attempt == 1)
    after = [op.status for op in history.operations if op.key == key and op.started >= healed_at]
    # What the mode answered, for the table in docs/design.md (shown with -s).
    print(
        f"{path} cut at {boundary}: the cut-off attempt got {first.status}; during the cut "
        f"{sorted({s for s, _ in during}, key=str)}; after the heal {after}"
    )
    for op in history.operations:  # the timeline, relative to the cut
        if op.key == key:
            print(f"  {op.attempt}: {op.status} {op.started - cut:+.2f}..{op.ended - cut:+.2f} s")
    print(report)
    report.assert_ok()
    # While the link was down the app answered, 503 or 409, never hung (DESIGN 13).
    assert during, "no attempt was made during the partition"
    for status, took in during:
        assert status in (503, 409), f"answered {status} during the partition"
        assert took <= FAIL_WITHIN, f"an answer took {took:.2f} s during the partition"
    # The key ended with a final answer, and a single effect.
    assert 201 in after, "the key never got its 201 after the heal"
    # A retry after an unknown outcome never sees its own lost attempt as a twin for
    # longer than the lock: every 409 comes within the lock (and a second of slack)
    # of the end of an attempt of the key that got no final answer. (Measured from
    # that end, not from the cut: an attempt made during the cut may reach the
    # database when the link heals, by TCP's retransmission, after its client gave
    # up, and its transaction then holds the key until the server's idle bound.)
    lost = [op.ended for op in history.operations if op.key == key and op.status in (None, 503)]
    late = [
        op
        for op in history.operations
        if op.key == key
        and op.status == 409
        and not any(end <= op.started <= end + LOCK + 1.0 for end in lost)
    ]
    assert not late, f"told 409 at {late[0].started - cut:+.2f} s, long after any lost attempt"


#: A lock the partition below does not outlast (beats every 4 s: a lock taken or
#: extended before the cut lives at least 8 s past it), so the finish can land after
#: the heal with the key still this attempt's.
LONG_LOCK = 12.0


@pytest.mark.parametrize(
    "landed",
    [
        pytest.param(False, id="finish-cut"),
        pytest.param(True, id="finish-reply-lost", marks=pytest.mark.slow),
    ],
)
def test_handler_mode_never_acknowledges_an_answer_it_could_not_store(
    app_host: AppHost, fresh_pg_url: str, tmp_path: Path, landed: bool
) -> None:
    """The link is cut just before the handler's finish (``finish-cut``: the finish
    never reaches the database), or while the finish sits in the relay (``landed``:
    it commits, its reply is lost). Either way the app cannot know the answer is
    stored, so it answers 503, never the handler's 201; the finish is tried again in
    the background, lands (or finds it landed) after the heal, and the retry gets the
    handler's one answer replayed: the handler ran once."""
    never_acknowledges_unstored(serve(app_host, fresh_pg_url, tmp_path, LONG_LOCK), landed)


def never_acknowledges_unstored(served: Served, landed: bool) -> None:
    """The body of the test above, on any store the app can run (``served``)."""
    assert served.relay is not None
    history, key, work = History(), f"unstored-{'landed' if landed else 'cut'}", 1.0
    with httpx.Client(base_url=served.url, timeout=FAIL_WITHIN + 5) as client:
        assert attempt(history, client, "/charges", f"{key}-warm") == 201
        if landed:
            served.relay.delay = served.delay
        first = threading.Thread(target=attempt, args=(history, client, "/charges", key, work))
        first.start()
        eventually(lambda: served.charged(key), "the charge", timeout=10)
        # Landed: the finish left the app and sits in the relay's delay, on the
        # machine's side of the cut. Cut: the handler still works, and its finish
        # meets the cut.
        time.sleep(work + served.delay / 2 if landed else work / 2)
        with served.host.back.partitioned():
            cut = history.now()
            first.join(timeout=FAIL_WITHIN + 5)
            during = attempt(history, client, "/charges", key)
        healed_at = history.now()
        served.relay.delay = 0.0
        assert not first.is_alive(), "the first attempt never got an answer"
        retry_to_final(history, client, "/charges", key, SETTLE + 10)
    ops = [op for op in history.operations if op.key == key]
    for op in ops:
        print(f"  {op.attempt}: {op.status} {op.started - cut:+.2f}..{op.ended - cut:+.2f} s")
    assert ops[0].status == 503, f"the cut-off attempt was answered {ops[0].status}"
    assert during in (503, 409), f"answered {during} during the partition"
    finals = {(op.status, op.body) for op in ops if op.status == 201}
    assert len(finals) == 1, "the key never got its 201 after the heal, or got two"
    assert served.runs(key) == 1, "the handler ran again: the answer was not stored"
    served.check(history, [key, f"{key}-warm"], healed_at).assert_ok()
