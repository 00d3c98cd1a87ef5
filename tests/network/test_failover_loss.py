"""What a failover loses when the standby lags (issue 35 items 4 and 5, DESIGN 13),
measured on Redis (with and without ``replicas=1``) and on PostgreSQL (asynchronous
and synchronous replication).

Each trial, on a primary and a replica of its own:

1. ``BEFORE`` keys are claimed and their handlers run (one effect each) while the
   replica keeps up;
2. the replica is made to lag (Redis: the replica SIGSTOPped; PostgreSQL: the
   standby's WAL receiver SIGSTOPped), and meanwhile those keys are finished and
   ``DURING`` more keys are sent whole;
3. the primary is killed while the replica lags; the replica resumes and is
   promoted (by Sentinel, by ``pg_ctl promote``);
4. every key is retried until it gets a final answer, and the history checker judges.

Counted: acknowledged answers the failover lost (the client was told 201, the
promoted replica does not have it, and the retry ran the handler again and answered
otherwise), and handlers run twice. A handler whose finish failed (503) also runs
again after the failover, lost or not: the answer was never given, and only a key
derived from ours (R4) keeps its effect single at the provider.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
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

from .guarded import execute, request, run_key, settle
from .replication import replicated_pair

pytestmark = pytest.mark.slow

BEFORE = 10
DURING = 10
LOCK = timedelta(seconds=2)


@dataclass(frozen=True)
class Loss:
    """A trial's numbers."""

    acknowledged_before: int
    """Keys answered 201 before the primary died."""
    lost: int
    """Of those, answers the failover lost (the store or a later answer differs)."""
    rerun: int
    """Keys whose handler ran more than once."""
    refused: int
    """Finishes and claims answered 503 during the lag (not acknowledged)."""
    report: HistoryReport

    def __str__(self) -> str:
        return (
            f"{self.acknowledged_before} acknowledged before the kill, {self.lost} lost, "
            f"{self.rerun} handlers run twice, {self.refused} refused during the lag"
        )


def trial(
    open_store: Callable[[], Any],
    lagging: Callable[[], AbstractContextManager[None]],
    kill: Callable[[], None],
    promote: Callable[[], None],
) -> Loss:
    history = History()
    scope = f"loss-{uuid.uuid4().hex[:8]}"
    before = [f"a{n}" for n in range(BEFORE)]
    during = [f"b{n}" for n in range(DURING)]
    first: dict[str, tuple[int, bytes]] = {}
    with open_store() as store:
        started = {
            key: (history.now(), execute(store, history, request(scope, key, LOCK)))
            for key in before
        }
        with lagging():

            def finish(key: str) -> None:
                at, executed = started[key]
                first[key] = settle(store, executed)
                history.record(key, *first[key], started=at, ended=history.now())

            def whole(key: str) -> None:
                with history.operation(key) as op:
                    first[key] = run_key(store, history, request(scope, key, LOCK))
                    op.answer(*first[key])

            threads = [threading.Thread(target=finish, args=(k,)) for k in before]
            threads += [threading.Thread(target=whole, args=(k,)) for k in during]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            kill()
        promote()
        deadline = time.monotonic() + 60
        for key in before + during:  # retried to a final answer
            while True:
                with history.operation(key) as op:
                    op.answer(*run_key(store, history, request(scope, key, LOCK)))
                if op.final:
                    break
                assert time.monotonic() < deadline, f"{key} never got a final answer"
                time.sleep(0.1)
        records = {key: store.get(scope, key) for key in before + during}
    report = history.check(records=records)
    acknowledged = {key for key, (status, _) in first.items() if status == 201}
    broken = {
        v.key
        for v in report.violations
        if v.property in (Property.LOST_ANSWER, Property.REPLAY_MISMATCH)
    }
    runs = Counter(effect.key for effect in history.effects)
    return Loss(
        acknowledged_before=len(acknowledged),
        lost=len(broken & acknowledged),
        rerun=sum(1 for n in runs.values() if n > 1),
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
    if replicas:
        # Nothing acknowledged is lost: the finishes in the lag were refused.
        assert loss.lost == 0 and loss.acknowledged_before == 0
        assert loss.refused == BEFORE + DURING
    else:
        # The trial does reach the loss it measures.
        assert loss.lost == BEFORE + DURING == loss.acknowledged_before


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
    if synchronous:
        assert loss.lost == 0 and loss.acknowledged_before == 0
    else:
        assert loss.lost == BEFORE + DURING == loss.acknowledged_before
