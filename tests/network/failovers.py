"""Failovers under load, judged by the history checker (issue 35, the Numbers): the
trials `benchmarks/faults.py --failovers N` runs, and the slow tests too.

A trial starts a primary and its replicas of its own, sends ``keys`` handler-mode
requests (`guarded`) from a few client threads, each key retried until it gets a
final answer, and once a third of them are answered kills the primary, sometimes with
the replicas lagging (their link cut just before), and promotes a replica:

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
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from idempotence.stores.postgres import PostgresStore
from idempotence.stores.redis import RedisStore
from idempotence.testing import History, HistoryReport, Property
from tests.support.redis import sentinel_group

from .guarded import Provider, request, run_key
from .replication import replicated_pair

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


@contextlib.contextmanager
def _setup(kind: str) -> Iterator[_Setup]:
    if kind == "postgres":
        with replicated_pair(synchronous=True) as pair:
            with PostgresStore(pair.primary_url()) as store:
                store.migrate()

            def promote() -> None:
                pair.promote()
                pair.forget_standby()

            yield _Setup(
                lambda: PostgresStore(pair.url, statement_timeout=BOUND, connect_timeout=2.0),
                pair.lagging,
                pair.kill_primary,
                promote,
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
            )
    else:
        raise ValueError(f"no failover of kind {kind!r}: one of {KINDS}")


def failover(
    kind: str, keys: int = 100, *, lagging: bool = False, clients: int = 4, seed: int = 0
) -> Failover:
    """Run one trial (see the module's documentation)."""
    rng = random.Random(seed)
    history = History()
    provider = Provider(history)
    scope = f"failover-{uuid.uuid4().hex[:8]}"
    names = [f"f{n}" for n in range(keys)]
    with _setup(kind) as setup:
        deadline = time.monotonic() + 180
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
        with setup.open_store() as store:
            records = {key: store.get(scope, key) for key in names}
    report = history.check(records=records, healed_at=promoted, settle_within=SETTLE)
    after = [op.ended for op in history.operations if op.started >= killed and op.status == 201]
    back = min(after, default=float("inf"))
    return Failover(
        kind, lagging, report, provider.rerun(), promoted - killed, back - killed, back - promoted
    )


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
    todo = list(reversed(keys))
    lock = threading.Lock()
    history = provider.history

    def client() -> None:
        with open_store() as store:
            while time.monotonic() < deadline:
                with lock:
                    if not todo:
                        return
                    key = todo.pop()
                while time.monotonic() < deadline:
                    with history.operation(key) as op:
                        op.answer(*run_key(store, provider, request(scope, key, LOCK)))
                    if op.final:
                        break
                    time.sleep(0.1)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(deadline - time.monotonic(), 0) + 30)
