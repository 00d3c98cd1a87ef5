"""What a failover loses when the replica lags (issue 35 items 4 and 5, DESIGN 13),
measured on Redis (with and without ``replicas=1``) and on PostgreSQL (asynchronous
and synchronous replication).

Each trial, on a primary and replicas of its own:

1. ``BEFORE`` keys are claimed and their handlers run (a charge each) while the
   replicas keep up;
2. the replicas are made to lag (SIGSTOPped Redis replicas, or the standby's WAL
   receiver, and their link cut by the primary), and meanwhile those keys are
   finished and ``DURING`` more keys are sent whole;
3. the primary is killed while the replicas lag; they resume and one is promoted
   (by Sentinel, by ``pg_ctl promote``);
4. every key is retried until it gets a final answer, and the history checker judges.

Counted: acknowledged answers the failover lost (the client was told 201, the
promoted replica had not finished the key, and its retry ran the handler again),
handlers run twice, keys charged twice at a provider that dedups by the key derived
from the record's id (R4), and answers that changed. A handler whose finish was
refused (503) runs again after the failover too: its answer was never given, and the
derived key keeps its charge single.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from idempotence.stores.postgres import PostgresStore
from idempotence.stores.redis import RedisStore
from idempotence.testing import History, HistoryReport, Property
from tests.support.redis import sentinel_group

from .guarded import Provider, execute, request, run_key, settle
from .replication import replicated_pair

pytestmark = pytest.mark.slow

BEFORE = 10
DURING = 10
LOCK = timedelta(seconds=2)


@dataclass(frozen=True)
class Loss:
    """A trial's numbers."""

    acknowledged: int
    """Keys answered 201 before the primary died."""
    lost: int
    """Of those, keys the promoted replica had not finished: their retry ran the
    handler again."""
    rerun: int
    """Keys whose handler ran more than once (lost, or a finish refused in the lag)."""
    double_charged: int
    """Keys charged twice although the provider dedups by the derived key: the
    claim itself was lost, so the retry got a new record id, hence a new key."""
    changed: int
    """Keys whose client got two different final answers."""
    refused: int
    """Finishes and claims answered 503 during the lag (not acknowledged)."""
    report: HistoryReport

    def __str__(self) -> str:
        return (
            f"{self.acknowledged} acknowledged before the kill, {self.lost} of them lost; "
            f"{self.rerun} handlers run twice, {self.double_charged} keys charged twice, "
            f"{self.changed} answers changed; {self.refused} refused (503) during the lag"
        )


def trial(
    open_store: Callable[[], Any],
    lagging: Callable[[], AbstractContextManager[None]],
    kill: Callable[[], None],
    promote: Callable[[], None],
) -> Loss:
    history = History()
    provider = Provider(history)
    scope = f"loss-{uuid.uuid4().hex[:8]}"
    before = [f"a{n}" for n in range(BEFORE)]
    during = [f"b{n}" for n in range(DURING)]
    first: dict[str, tuple[int, bytes]] = {}
    with open_store() as store:
        started = {
            key: (history.now(), execute(store, provider, request(scope, key, LOCK)))
            for key in before
        }
        with lagging():

            def finish(key: str) -> None:
                at, executed = started[key]
                first[key] = settle(store, executed)
                history.record(key, *first[key], started=at, ended=history.now())

            def whole(key: str) -> None:
                with history.operation(key) as op:
                    first[key] = run_key(store, provider, request(scope, key, LOCK))
                    op.answer(*first[key])

            threads = [threading.Thread(target=finish, args=(k,)) for k in before]
            threads += [threading.Thread(target=whole, args=(k,)) for k in during]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            kill()
        runs_at_kill = dict(provider.runs)
        promote()
        deadline = time.monotonic() + 60
        for key in before + during:  # retried to a final answer
            while True:
                with history.operation(key) as op:
                    op.answer(*run_key(store, provider, request(scope, key, LOCK)))
                if op.final:
                    break
                assert time.monotonic() < deadline, f"{key} never got a final answer"
                time.sleep(0.1)
        records = {key: store.get(scope, key) for key in before + during}
    report = history.check(records=records)
    acknowledged = {key for key, (status, _) in first.items() if status == 201}
    return Loss(
        acknowledged=len(acknowledged),
        lost=sum(1 for key in acknowledged if provider.runs[key] > runs_at_kill.get(key, 0)),
        rerun=provider.rerun(),
        double_charged=report.count(Property.DUPLICATE_EFFECT),
        changed=len({v.key for v in report.violations if v.property is Property.REPLAY_MISMATCH}),
        refused=sum(1 for status, _ in first.values() if status == 503),
        report=report,
    )


@pytest.mark.parametrize("replicas", [0, 1], ids=["no-wait", "wait"])
def test_redis_failover_with_a_lagging_replica(replicas: int) -> None:
    # Two replicas: once one is promoted, the other replicates from it, so a store
    # that waits for one replica can write again.
    with sentinel_group(replica_count=2) as group:
        loss = trial(
            lambda: RedisStore(
                group.url,
                prefix=f"idemtest{uuid.uuid4().hex[:8]}",
                replicas=replicas,
                replica_timeout=0.3,
            ),
            group.lagging,
            group.master.stop,
            group.wait_promoted,
        )
    print(f"Redis, replicas={replicas}: {loss}")
    check(loss, waited=bool(replicas))


@pytest.mark.parametrize("synchronous", [False, True], ids=["async", "sync"])
def test_postgres_failover_with_a_lagging_standby(synchronous: bool) -> None:
    with replicated_pair(synchronous=synchronous) as pair:
        with PostgresStore(pair.primary_url()) as store:
            store.migrate()

        def promote() -> None:
            pair.promote()
            if synchronous:
                pair.forget_standby()

        loss = trial(
            lambda: PostgresStore(pair.url, statement_timeout=2.0, connect_timeout=2.0),
            pair.lagging,
            pair.kill_primary,
            promote,
        )
    print(f"PostgreSQL, {'sync' if synchronous else 'async'}: {loss}")
    check(loss, waited=synchronous)


def check(loss: Loss, *, waited: bool) -> None:
    if waited:
        # Nothing acknowledged, so nothing lost: every write in the lag was refused.
        # The handlers whose finish was refused run again after the failover (their
        # claims survived, so the provider's dedup answers them the same charge).
        assert (loss.acknowledged, loss.lost, loss.changed) == (0, 0, 0)
        assert loss.double_charged == 0 and loss.rerun == BEFORE
        assert loss.refused == BEFORE + DURING
    else:
        # Every key of the lag was acknowledged and lost: the trial reaches the loss
        # it measures. A key claimed before the lag keeps its record id, so the
        # provider answers its second run with the first charge; a key claimed in
        # the lag lost its claim too, and is charged twice.
        assert loss.acknowledged == loss.lost == loss.rerun == BEFORE + DURING
        assert loss.double_charged == loss.changed == DURING
