"""B4: the enqueuer delivers committed staged jobs exactly once per job_key, and the
built-in runner executes them at least once, with retries and a dead end.

Each test that takes ``flavour`` runs on the sync services and on the async ones they
are generated from (F7)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from idempotence import StoreError
from idempotence.maintenance import (
    Enqueuer,
    EnqueuerConfig,
    Job,
    JobRegistry,
    JobRunner,
    JobRunnerConfig,
    Signals,
)
from idempotence.maintenance import _ops as mops
from idempotence.states import StagedJob
from idempotence.stores import Store, Transaction
from tests.maintenance.support import Backend, Flavour, claim, in_threads, new_scope
from tests.support.sql_dialects import SQL

FAST = EnqueuerConfig(batch_pause=0.0)
RUN_NOW = JobRunnerConfig(batch_pause=0.0, backoff=timedelta(0))


def stage(store: Store, n: int, *, name: str = "receipt", prefix: str = "job") -> list[str]:
    """Stage ``n`` jobs from one phase of a fresh key; return their job keys."""
    scope = new_scope()
    lease = claim(store, scope, "k").lease
    assert lease is not None
    keys = [f"{prefix}-{scope}-{i}" for i in range(n)]
    with store.transaction() as tx:
        store.end_phase(
            tx, lease, jobs=[(k, name, {"n": i}) for i, k in enumerate(keys)], recovery_point="x"
        )
    return keys


def test_b4_delivers_committed_staged_jobs(db: Backend, flavour: Flavour) -> None:
    keys = stage(db.store, 3)

    result = flavour(Enqueuer, FAST).run_once()

    assert result.delivered == tuple(keys)
    assert result.duplicates == 0
    assert db.count("idempotence_staged_jobs") == 0
    rows = db.execute("SELECT job_key, name, status, attempts FROM idempotence_jobs ORDER BY id")
    assert rows == [
        {"job_key": k, "name": "receipt", "status": "ready", "attempts": 0} for k in keys
    ]


def test_b4_a_job_key_delivered_before_is_absorbed(db: Backend, flavour: Flavour) -> None:
    """Exactly once per job_key: a job staged again (a phase re-run after its jobs
    were delivered) reaches the runner once."""
    stage(db.store, 2, prefix="same")
    flavour(Enqueuer, FAST).run_once()
    scope = db.execute("SELECT scope FROM idempotence_jobs")[0]["scope"]
    lease = claim(db.store, scope, "k2").lease
    assert lease is not None
    with db.store.transaction() as tx:
        db.store.stage_jobs(tx, lease, [(f"same-{scope}-0", "receipt", {})])

    result = flavour(Enqueuer, FAST).run_once()

    assert (result.delivered, result.duplicates) == ((), 1)
    assert db.count("idempotence_jobs") == 2
    assert db.count("idempotence_staged_jobs") == 0


class BrokenSink:
    # Raises before returning anything, so it fails the async enqueuer's await too.
    def deliver(self, store: Store, tx: Transaction, jobs: Sequence[StagedJob]) -> list[str]:
        raise ConnectionError("the broker is down")


def test_b4_a_failed_delivery_leaves_the_jobs_staged(db: Backend, flavour: Flavour) -> None:
    stage(db.store, 3)
    with pytest.raises(ConnectionError):
        flavour(Enqueuer, FAST, sink=BrokenSink()).run_once()
    assert db.count("idempotence_staged_jobs") == 3
    assert db.count("idempotence_jobs") == 0
    assert len(flavour(Enqueuer, FAST).run_once().delivered) == 3


def test_b4_empty_database_is_a_no_op(db: Backend, flavour: Flavour) -> None:
    result = flavour(Enqueuer, FAST).run_once()
    assert (result.delivered, result.duplicates, result.batches) == ((), 0, 1)


def test_b4_works_in_batches_until_a_short_page(db: Backend, flavour: Flavour) -> None:
    stage(db.store, 25)
    signals = Signals()
    sizes: list[int] = []
    signals.on("enqueuer.batch", lambda payload: sizes.append(payload[1]))
    config = EnqueuerConfig(batch_size=10, batch_pause=0.0)

    result = flavour(Enqueuer, config, signals=signals).run_once()

    assert sizes == [10, 10, 5]
    assert result.batches == 3
    assert len(result.delivered) == 25


def test_b4_two_enqueuers_at_once_deliver_each_job_once(db: Backend, flavour: Flavour) -> None:
    keys = stage(db.store, 100)
    config = EnqueuerConfig(batch_size=7, batch_pause=0.0)
    one, two = flavour(Enqueuer, config, node=True), flavour(Enqueuer, config, node=True)

    results = in_threads(one.run_once, two.run_once)

    delivered = [k for r in results for k in r.delivered]
    assert sorted(delivered) == sorted(keys)
    assert sum(r.duplicates for r in results) == 0


def test_b4_a_batch_in_flight_is_skipped_by_another_enqueuer(pg_db: Backend) -> None:
    """SKIP LOCKED: while one node holds its batch open, another delivers the rest
    instead of waiting or taking the same jobs."""
    keys = stage(pg_db.store, 20)
    holding, release = threading.Event(), threading.Event()
    signals = Signals()

    def hold(jobs: Any) -> None:
        if jobs:
            holding.set()
            assert release.wait(10)

    signals.on("enqueuer.batch_locked", hold)
    config = EnqueuerConfig(batch_size=10, batch_pause=0.0, max_batches=1)
    slow = Enqueuer(pg_db.open(), config, signals=signals)
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(slow.run_once()))
    thread.start()
    try:
        assert holding.wait(10)
        quick = Enqueuer(pg_db.open(), EnqueuerConfig(batch_size=10, batch_pause=0.0)).run_once()
    finally:
        release.set()
        thread.join(timeout=10)
    assert len(quick.delivered) == 10
    assert sorted([*quick.delivered, *box[0].delivered]) == sorted(keys)


# -- the built-in runner ------------------------------------------------------------------


def test_b4_the_runner_runs_each_job_with_its_job_key(db: Backend, flavour: Flavour) -> None:
    keys = stage(db.store, 3)
    flavour(Enqueuer, FAST).run_once()
    seen: list[Job] = []
    registry = JobRegistry()
    registry.register("receipt")(seen.append)

    result = flavour(JobRunner, RUN_NOW, jobs=registry).run_once()

    assert result.done == tuple(keys)
    assert [(j.job_key, j.args, j.attempt) for j in seen] == [
        (k, {"n": i}, 1) for i, k in enumerate(keys)
    ]
    assert db.count("idempotence_jobs", "status = 'done'") == 3
    assert flavour(JobRunner, RUN_NOW, jobs=registry).run_once().done == ()


def test_b4_a_failing_job_is_retried_then_dead(db: Backend, flavour: Flavour) -> None:
    (key,) = stage(db.store, 1)
    flavour(Enqueuer, FAST).run_once()
    attempts: list[int] = []
    registry = JobRegistry()

    @registry.register("receipt")
    def fails(job: Job) -> None:
        attempts.append(job.attempt)
        raise RuntimeError("mail server says no")

    runner = flavour(
        JobRunner, JobRunnerConfig(backoff=timedelta(0), max_attempts=3), jobs=registry
    )
    results = [runner.run_once() for _ in range(4)]

    assert [(r.retried, r.dead) for r in results] == [
        ((key,), ()),
        ((key,), ()),
        ((), (key,)),
        ((), ()),
    ]
    assert attempts == [1, 2, 3]
    row = db.execute("SELECT status, last_error FROM idempotence_jobs")[0]
    assert row == {"status": "dead", "last_error": "RuntimeError: mail server says no"}


def test_b4_a_failed_job_waits_for_its_backoff(db: Backend, flavour: Flavour) -> None:
    stage(db.store, 1)
    flavour(Enqueuer, FAST).run_once()
    registry = JobRegistry()
    registry.register("receipt")(lambda job: 1 / 0)
    runner = flavour(JobRunner, JobRunnerConfig(backoff=timedelta(hours=1)), jobs=registry)
    assert len(runner.run_once().retried) == 1
    assert runner.run_once().retried == ()  # not due yet


def test_b4_a_job_whose_runner_died_runs_again_after_its_lease(
    db: Backend, flavour: Flavour
) -> None:
    """At-least-once: the job is picked by a runner that never reports back."""
    (key,) = stage(db.store, 1)
    flavour(Enqueuer, FAST).run_once()
    lease = timedelta(minutes=10)
    died = db.store._perform(lambda d: mops.pick_jobs(d, ["receipt"], lease, 10, None))
    assert [j.job_key for j in died] == [key]
    seen: list[Job] = []
    registry = JobRegistry()
    registry.register("receipt")(seen.append)
    runner = flavour(JobRunner, RUN_NOW, jobs=registry)
    assert runner.run_once().done == ()  # still leased
    # The lease runs out: its end (run_at) moved into the past, not waited for.
    aged = SQL[db.kind].aged.format(c="run_at").replace(":s", "%(s)s").replace(":us", "%(us)s")
    db.execute(f"UPDATE idempotence_jobs SET run_at = {aged}", {"s": 3600.0, "us": 3600 * 10**6})
    assert runner.run_once().done == (key,)
    assert [j.attempt for j in seen] == [2]


def test_b4_f7_the_async_runner_awaits_coroutine_job_functions(db: Backend) -> None:
    keys = stage(db.store, 2)
    flavour = Flavour("async", db)
    flavour(Enqueuer, FAST).run_once()
    sent: list[str] = []
    registry = JobRegistry()

    @registry.register("receipt")
    async def send(job: Job) -> None:
        await asyncio.sleep(0)
        sent.append(job.job_key)

    assert flavour(JobRunner, RUN_NOW, jobs=registry).run_once().done == tuple(keys)
    assert sent == keys


def test_b4_f7_the_sync_runner_fails_a_coroutine_job_function_clearly(db: Backend) -> None:
    stage(db.store, 1)
    Enqueuer(db.store, FAST).run_once()
    registry = JobRegistry()

    @registry.register("receipt")
    async def send(job: Job) -> None:
        raise AssertionError("never awaited")

    assert len(JobRunner(db.store, RUN_NOW, jobs=registry).run_once().retried) == 1
    (row,) = db.execute("SELECT status, last_error FROM idempotence_jobs")
    assert row["status"] == "ready"
    assert "returned an awaitable" in row["last_error"]
    assert "AsyncJobRunner" in row["last_error"]


def test_b4_jobs_of_unknown_names_are_left_alone(db: Backend, flavour: Flavour) -> None:
    stage(db.store, 2, name="unknown")
    flavour(Enqueuer, FAST).run_once()
    registry = JobRegistry()
    registry.register("receipt")(lambda job: None)
    assert flavour(JobRunner, RUN_NOW, jobs=registry).run_once().done == ()
    assert db.count("idempotence_jobs", "attempts = 0") == 2


def test_b4_two_runners_at_once_run_each_job_once(db: Backend, flavour: Flavour) -> None:
    keys = stage(db.store, 40)
    flavour(Enqueuer, FAST).run_once()
    calls: Counter[str] = Counter()
    lock = threading.Lock()
    registry = JobRegistry()

    @registry.register("receipt")
    def count(job: Job) -> None:
        with lock:
            calls[job.job_key] += 1

    config = JobRunnerConfig(batch_size=3, batch_pause=0.0)
    one = flavour(JobRunner, config, jobs=registry, node=True)
    two = flavour(JobRunner, config, jobs=registry, node=True)

    results = in_threads(one.run_once, two.run_once)

    assert sorted(k for r in results for k in r.done) == sorted(keys)
    assert set(calls.values()) == {1}


def test_b4_the_enqueuer_statement_timeout_applies(pg_db: Backend) -> None:
    """A timeout per query: a batch stuck behind a lock gives up instead of piling up."""
    import psycopg

    stage(pg_db.store, 1)
    with psycopg.connect(pg_db.url) as blocker:
        blocker.execute("LOCK TABLE idempotence_staged_jobs IN ACCESS EXCLUSIVE MODE")
        config = EnqueuerConfig(query_timeout=0.2)
        started = time.monotonic()
        with pytest.raises(StoreError, match="statement timeout"):
            Enqueuer(pg_db.store, config).run_once()
        assert time.monotonic() - started < 5
