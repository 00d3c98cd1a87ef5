"""Failovers under load, judged by the history checker (issue 35, the Numbers): the
trials `benchmarks/faults.py --failovers N` runs, and the slow tests too.

A trial starts a primary and its replicas of its own, sends ``keys`` handler-mode
requests (`guarded`) from a few client threads, each key retried until it gets a
final answer, and once a third of them are answered kills the primary, sometimes with
the replicas lagging (their link cut just before), and promotes a replica. With
``http=True`` the keys are guarded requests instead: sent over HTTP to the app the
partition runs serve (``app.py``, under uvicorn on this machine: no namespace, so no
root), the PostgreSQL trial's keys spread over its handler-mode, request-as-transaction
and flow endpoints, the Redis trial's on its handler-mode one; the provider there
derives its key from the key row's id (R4), so a key run again on a new row charges
twice:

* ``postgres``: a primary and a synchronous standby (``replication.py``), the store
  on a multi-host URL; the standby promoted with ``pg_ctl promote``, and its
  ``synchronous_standby_names`` cleared at once, as failover tooling does;
* ``redis``: a master, two replicas and a sentinel (``tests/support/redis.py``), the
  store on the ``redis+sentinel://`` URL with ``replicas=1``; the sentinel promotes.

Measured: the history checker's violations (duplicate charges at a provider that
dedups by the derived key, answers replayed differently, acknowledged answers the
store lost, keys not finished within the lock timeout plus 10 s of the promotion),
handlers that ran twice, and how soon after the kill and after the promotion a
request got a 2xx again.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import psycopg

from idempotence.stores.postgres import PostgresStore
from idempotence.stores.redis import RedisStore
from idempotence.testing import History, HistoryReport, Property
from tests.support.redis import free_port, sentinel_group

from .guarded import Provider, request, run_key
from .hosts import run_server, stop
from .replication import replicated_pair
from .test_partitions import Served

KINDS = ("postgres", "redis")
LOCK = timedelta(seconds=2)
BOUND = 2.0
"""The PostgreSQL store's statement_timeout; the Redis store's timeout is 1 s."""
SETTLE = LOCK.total_seconds() + 10.0
"""Every key finished within the lock timeout plus 10 s of the promotion."""


@dataclass(frozen=True)
class Failover:
    """One trial's numbers."""

    kind: str
    lagging: bool
    report: HistoryReport
    rerun: int
    """Keys whose handler ran more than once (a finish refused, then a takeover)."""
    promoted_after: float
    """From the kill to the promotion done, seconds."""
    back_after_kill: float
    """From the kill to the first 2xx of a request sent after it, seconds."""
    back_after_promotion: float

    def numbers(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "lagging": self.lagging,
            "keys": self.report.keys,
            "attempts": self.report.operations,
            "charges": self.report.effects,
            "violations": {
                prop.value: self.report.count(prop) for prop in Property if self.report.count(prop)
            },
            "handlers_run_twice": self.rerun,
            "promoted_after_kill_s": round(self.promoted_after, 2),
            "back_after_kill_s": round(self.back_after_kill, 2),
            "back_after_promotion_s": round(self.back_after_promotion, 2),
            "settled_after_promotion_s": self.report.settle_after_heal,
        }

    def __str__(self) -> str:
        lag = ", replicas lagging" if self.lagging else ""
        return (
            f"{self.kind} failover{lag}: promoted {self.promoted_after:.1f} s after the kill, "
            f"a 2xx again {self.back_after_kill:.1f} s after the kill "
            f"({self.back_after_promotion:.1f} s after the promotion); "
            f"{self.rerun} handlers run twice; {self.report}"
        )


@dataclass(frozen=True)
class _Setup:
    open_store: Callable[[], Any]
    lagging: Callable[[], AbstractContextManager[None]]
    kill: Callable[[], None]
    promote: Callable[[], None]
    app_env: dict[str, str]
    """The app's store (app.py's environment), for the trial over HTTP."""


@contextlib.contextmanager
def _setup(kind: str) -> Iterator[_Setup]:
    if kind == "postgres":
        with replicated_pair(synchronous=True) as pair:
            with PostgresStore(pair.primary_url()) as store:
                store.migrate()
            with psycopg.connect(pair.primary_url(), autocommit=True) as conn:
                conn.execute(TRANSFERS)  # app.py's /transfers and /rides

            def promote() -> None:
                pair.promote()
                pair.forget_standby()

            yield _Setup(
                lambda: PostgresStore(pair.url, statement_timeout=BOUND, connect_timeout=2.0),
                pair.lagging,
                pair.kill_primary,
                promote,
                {"NET_STORE": "postgres", "NET_DATABASE_URL": pair.url},
            )
    elif kind == "redis":
        # Two replicas: once one is promoted, the other replicates from it, so a
        # store that waits for one replica can write again.
        with sentinel_group(replica_count=2) as group:
            prefix = f"idemtest{uuid.uuid4().hex[:8]}"

            def promoted() -> None:
                group.wait_promoted()  # the sentinel promotes

            yield _Setup(
                lambda: RedisStore(group.url, prefix=prefix, replicas=1, replica_timeout=0.3),
                group.lagging,
                group.master.stop,
                promoted,
                {
                    "NET_STORE": "redis",
                    "NET_REDIS_URL": f"{group.url}?replicas=1&replica_timeout=0.3",
                    "NET_REDIS_PREFIX": prefix,
                    "NET_STATEMENT_TIMEOUT": "1",  # the Redis store's timeout
                },
            )
    else:
        raise ValueError(f"no failover of kind {kind!r}: one of {KINDS}")


def failover(
    kind: str,
    keys: int = 100,
    *,
    lagging: bool = False,
    clients: int = 4,
    seed: int = 0,
    http: bool = False,
) -> Failover:
    """Run one trial (see the module's documentation)."""
    rng = random.Random(seed)
    history = History()
    provider = Provider(history)
    scope = f"failover-{uuid.uuid4().hex[:8]}"
    names = [f"f{n}" for n in range(keys)]
    with _setup(kind) as setup, contextlib.ExitStack() as stack:
        deadline = time.monotonic() + 180
        app: Served | None = None
        if http:
            app = stack.enter_context(_app(kind, setup))
            paths = KIND_PATHS[kind]
            routes = {name: rng.choice(paths) for name in names}
            loader = threading.Thread(
                target=load_http, args=(app.url, history, routes, clients, deadline)
            )
        else:
            loader = threading.Thread(
                target=load, args=(setup.open_store, provider, scope, names, clients, deadline)
            )
        loader.start()
        while len({op.key for op in history.operations if op.status == 201}) < keys // 3:
            if not loader.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the load stopped before a third of the keys were done")
            time.sleep(0.02)
        if lagging:
            with setup.lagging():
                time.sleep(rng.uniform(0.2, 0.8))  # writes in the lag: refused, not lost
                setup.kill()
        else:
            setup.kill()
        killed = history.now()
        setup.promote()
        promoted = history.now()
        loader.join(timeout=max(deadline - time.monotonic(), 0) + 30)
        if loader.is_alive():
            raise RuntimeError("the load did not end within its deadline")
        if app is not None:
            app.effects(history)
            records = app.records(names)
            rerun = _rerun(app.provider)
        else:
            with setup.open_store() as store:
                records = {key: store.get(scope, key) for key in names}
            rerun = provider.rerun()
    report = history.check(records=records, healed_at=promoted, settle_within=SETTLE)
    after = [op.ended for op in history.operations if op.started >= killed and op.status == 201]
    back = min(after, default=float("inf"))
    return Failover(kind, lagging, report, rerun, promoted - killed, back - killed, back - promoted)


def load(
    open_store: Callable[[], Any],
    provider: Provider,
    scope: str,
    keys: list[str],
    clients: int,
    deadline: float,
) -> None:
    """``clients`` threads, each with a store of its own (an app server), sending the
    keys until each has a final answer."""

    @contextlib.contextmanager
    def session() -> Iterator[Send]:
        with open_store() as store:
            yield lambda key: run_key(store, provider, request(scope, key, LOCK))

    drive(keys, provider.history, session, clients, deadline)


# -- the trial over HTTP ----------------------------------------------------------------------

TRANSFERS = "CREATE TABLE net_transfers (key TEXT NOT NULL, id TEXT NOT NULL)"
KIND_PATHS = {"postgres": ["/charges", "/transfers", "/rides"], "redis": ["/charges"]}
"""The app's endpoints each kind's keys are spread over (the Redis store: handler mode)."""


@contextlib.contextmanager
def _app(kind: str, setup: _Setup) -> Iterator[Served]:
    """app.py under uvicorn on 127.0.0.1, on the trial's store; its provider's file is
    the trial's own."""
    with tempfile.TemporaryDirectory(prefix="idem-failover-") as directory:
        provider = Path(directory) / "provider.sqlite3"
        env = {
            "NET_PROVIDER": str(provider),
            "NET_CHARGE_BY": "row",
            "NET_LOCK_TIMEOUT": str(LOCK.total_seconds()),
            "NET_STATEMENT_TIMEOUT": str(BOUND),
            **setup.app_env,
        }
        server, url = run_server("tests.network.app:app", env, "127.0.0.1", free_port())
        try:
            database = setup.app_env.get("NET_DATABASE_URL")
            redis = None
            if kind == "redis":
                redis = (setup.app_env["NET_REDIS_URL"], setup.app_env["NET_REDIS_PREFIX"])
            yield Served(cast(Any, None), None, url, database, provider, kind, redis)
        finally:
            stop(server)


Send = Callable[[str], "tuple[int, bytes] | None"]
"""One attempt at a key: its answer, or None (no answer: the request was cut off)."""


def drive(
    keys: list[str],
    history: History,
    session: Callable[[], AbstractContextManager[Send]],
    clients: int,
    deadline: float,
) -> None:
    """``clients`` threads, each with a ``session`` of its own (an app server's store,
    or an HTTP client), sending the keys until each has a final answer."""
    todo = list(reversed(keys))
    lock = threading.Lock()

    def client() -> None:
        with session() as send:
            while time.monotonic() < deadline:
                with lock:
                    if not todo:
                        return
                    key = todo.pop()
                while time.monotonic() < deadline:
                    with history.operation(key) as op:
                        answer = send(key)
                        if answer is not None:
                            op.answer(*answer)
                    if op.final:
                        break
                    time.sleep(0.1)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(deadline - time.monotonic(), 0) + 30)


def load_http(
    url: str,
    history: History,
    routes: dict[str, str],
    clients: int,
    deadline: float,
    timeout: float = BOUND + 8,
) -> None:
    """`drive` over HTTP: each key posted to its endpoint (``routes``)."""

    @contextlib.contextmanager
    def session() -> Iterator[Send]:
        with httpx.Client(base_url=url, timeout=timeout) as http:

            def send(key: str) -> tuple[int, bytes] | None:
                try:
                    response = http.post(routes[key], headers={"Idempotency-Key": key}, json={})
                except httpx.HTTPError:
                    return None
                return response.status_code, response.content

            yield send

    drive(list(routes), history, session, clients, deadline)


def _rerun(provider: Path) -> int:
    """Keys whose /charges handler ran more than once (the provider counts each run)."""
    with sqlite3.connect(provider) as db:
        db.execute("CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL)")
        query = "SELECT count(*) FROM (SELECT key FROM runs GROUP BY key HAVING count(*) > 1)"
        (count,) = db.execute(query).fetchone()
    return int(count)
