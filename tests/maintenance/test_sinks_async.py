"""Staged jobs delivered by the async enqueuer to RabbitMQ (aio-pika) and to Celery, and
the enqueuer's backoff while the broker is away (B4, R7, DESIGN 12). Real brokers: the
machine's RabbitMQ, behind a relay the test shuts and opens (tests/consumers/broker.py),
and a node of the test's own for the restart.

The backoff is read off a clock of the test's own: the enqueuer is handed a sleep that
records each pause and moves that clock instead of waiting, so a schedule of minutes
runs in a second, against the real broker."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pika
import pytest

from idempotence import AsyncStore, AsyncTransaction
from idempotence.maintenance import (
    AsyncCelerySink,
    AsyncEnqueuer,
    AsyncRabbitMQSink,
    BrokerUnavailable,
    Enqueuer,
    EnqueuerConfig,
    RabbitMQSink,
    Signals,
)
from idempotence.states import StagedJob
from tests.consumers.broker import Gate, OwnNode, broker_url
from tests.maintenance.brokers import celery_app, closed_port_url, consume, drain
from tests.maintenance.support import Backend
from tests.maintenance.test_enqueuer import stage
from tests.support.polling import eventually

FAST = EnqueuerConfig(batch_pause=0.0)


def run_once(db: Backend, sink: Any, config: EnqueuerConfig = FAST) -> Any:
    """One pass of the async enqueuer on an async store of ``db``, with ``sink``."""
    return db.loop.run(AsyncEnqueuer(db.open_async(), config, sink=sink).run_once())


def test_the_async_rabbitmq_sink_publishes_each_job_persistent_with_its_key_as_message_id(
    db: Backend, queue: str
) -> None:
    keys = stage(db.store, 3)
    sink = AsyncRabbitMQSink(broker_url(), routes={"receipt": queue})
    try:
        result = run_once(db, sink)
    finally:
        db.loop.run(sink.close())
    assert result.delivered == tuple(keys)
    assert db.count("idempotence_staged_jobs") == 0
    messages = drain(broker_url(), queue)
    assert [p.message_id for p, _ in messages] == keys
    assert all(p.delivery_mode == 2 and p.type == "receipt" for p, _ in messages)
    assert all(p.content_type == "application/json" for p, _ in messages)
    assert [json.loads(body) for _, body in messages] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_the_async_sink_reads_the_default_vhost_as_celery_writes_it(
    db: Backend, queue: str
) -> None:
    keys = stage(db.store, 1)
    sink = AsyncRabbitMQSink(broker_url().replace("/%2F", "//"), routes={"receipt": queue})
    try:
        assert run_once(db, sink).delivered == tuple(keys)
    finally:
        db.loop.run(sink.close())
    assert [p.message_id for p, _ in drain(broker_url(), queue)] == keys


def test_a_broker_that_is_down_leaves_every_job_staged_async(db: Backend, queue: str) -> None:
    keys = stage(db.store, 3)
    with pytest.raises(BrokerUnavailable, match="stay staged"):
        run_once(db, AsyncRabbitMQSink(closed_port_url(), timeout=2))
    assert db.count("idempotence_staged_jobs") == 3
    sink = AsyncRabbitMQSink(broker_url(), routes={"receipt": queue})
    try:
        assert run_once(db, sink).delivered == tuple(keys)
    finally:
        db.loop.run(sink.close())
    assert [p.message_id for p, _ in drain(broker_url(), queue)] == keys


def test_a_message_nobody_can_receive_is_refused_not_dropped_async(db: Backend) -> None:
    """aio-pika confirms a returned message unless told otherwise: the sink must
    treat it as refused."""
    stage(db.store, 1)
    # An exchange with no queue bound: the broker returns the message (mandatory).
    connection = pika.BlockingConnection(pika.URLParameters(broker_url()))
    exchange = f"idem-sink-x-{uuid.uuid4().hex[:8]}"
    connection.channel().exchange_declare(exchange, "direct", auto_delete=False)
    sink = AsyncRabbitMQSink(broker_url(), exchange=exchange)
    try:
        with pytest.raises(BrokerUnavailable, match="stay staged"):
            run_once(db, sink)
        assert db.count("idempotence_staged_jobs") == 1
    finally:
        db.loop.run(sink.close())
        connection.channel().exchange_delete(exchange)
        connection.close()


def test_the_async_celery_sink_sends_each_job_as_a_task_whose_id_is_the_job_key(
    db: Backend, queue: str
) -> None:
    keys = stage(db.store, 2)
    app = celery_app(broker_url())
    try:
        sink = AsyncCelerySink(app, tasks={"receipt": "shop.send_receipt"}, queue=queue)
        assert run_once(db, sink).delivered == tuple(keys)
    finally:
        app.close()
    messages = drain(broker_url(), queue)
    assert [p.headers["id"] for p, _ in messages] == keys
    assert {p.headers["task"] for p, _ in messages} == {"shop.send_receipt"}
    assert [json.loads(body)[1] for _, body in messages] == [{"n": 0}, {"n": 1}]  # kwargs


def test_the_async_celery_sink_needs_confirms_and_keeps_jobs_staged_while_the_broker_is_down(
    db: Backend,
) -> None:
    with pytest.raises(Exception, match="confirm_publish"):
        AsyncCelerySink(celery_app(broker_url(), confirm=False))
    stage(db.store, 2)
    app = celery_app(closed_port_url())
    try:
        with pytest.raises(BrokerUnavailable, match="stay staged"):
            run_once(db, AsyncCelerySink(app))
    finally:
        app.close()
    assert db.count("idempotence_staged_jobs") == 2


# -- the backoff -------------------------------------------------------------------------


class Schedule:
    """A clock of the test's own, moved by the enqueuer's pauses instead of a wait;
    the times of the sink's attempts on it, and what the test does between them."""

    def __init__(self) -> None:
        self.now = 0.0
        self.attempts: list[float] = []
        self.pauses: list[float] = []
        self.staged_between: list[int] = []


@pytest.fixture
def gate() -> Iterator[Gate]:
    relay = Gate(broker_url())  # shut: the broker is down
    try:
        yield relay
    finally:
        relay.shut()


def bases(first: float, most: float, failures: int) -> list[float]:
    """The backoff's waits before jitter: ``first`` doubling, capped at ``most``."""
    return [min(first * 2**n, most) for n in range(failures)]


def within_jitter(waits: Sequence[float], expected: Sequence[float], most: float) -> bool:
    jitter = FAST.jitter
    return len(waits) == len(expected) and all(
        base * (1 - jitter) - 1e-9 <= wait <= min(base * (1 + jitter), most) + 1e-9
        for wait, base in zip(waits, expected, strict=True)
    )


def test_the_async_enqueuer_backs_off_while_the_broker_is_away_and_then_delivers_each_job(
    db: Backend, queue: str, gate: Gate, caplog: pytest.LogCaptureFixture
) -> None:
    """Down for seven attempts, then back but the first confirm lost: the attempts
    come 0.5 s, 1 s, 2 s ... apart (jittered, at most 30 s), the jobs stay staged all
    along, the outage is logged once as it begins and once as it ends, and a guarded
    consumer runs each job once although the lost confirm sent it twice."""
    keys = stage(db.store, 3)
    clock = Schedule()
    down_for, lost_confirms = 7, 1
    real = AsyncRabbitMQSink(gate.url, routes={"receipt": queue}, timeout=5)
    took: list[bool] = []

    class Recording:
        async def deliver(
            self, store: AsyncStore, tx: AsyncTransaction, jobs: Sequence[StagedJob]
        ) -> list[str]:
            clock.attempts.append(clock.now)
            try:
                new = await real.deliver(store, tx, jobs)
            except BrokerUnavailable:
                took.append(False)
                raise
            if took.count(True) < lost_confirms:
                # The broker has the batch, but its confirm never reached the
                # enqueuer: to the enqueuer, the batch failed.
                took.append(True)
                raise BrokerUnavailable("the connection broke before the confirm came")
            took.append(True)
            return new

    stop = asyncio.Event()

    async def sleep(seconds: float, stopping: asyncio.Event) -> None:
        clock.pauses.append(seconds)
        clock.now += seconds
        clock.staged_between.append(db.count("idempotence_staged_jobs"))
        if len(clock.attempts) == down_for and not gate.is_open:
            gate.open()  # the broker is back
        if db.count("idempotence_staged_jobs") == 0:
            stop.set()  # all delivered: the pause after it is the last
        await asyncio.sleep(0)

    enqueuer = AsyncEnqueuer(db.open_async(), FAST, sink=Recording(), sleep=sleep)
    caplog.set_level(logging.DEBUG, logger="idempotence.maintenance.enqueuer")
    try:
        db.loop.run(asyncio.wait_for(enqueuer.run_forever(stop), 60))
    finally:
        db.loop.run(real.close())

    failures = down_for + lost_confirms
    assert took == [False] * down_for + [True] * (lost_confirms + 1)
    gaps = [b - a for a, b in zip(clock.attempts, clock.attempts[1:], strict=False)]
    expected = bases(FAST.sink_backoff, FAST.sink_max_backoff, failures)
    assert expected == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert within_jitter(gaps, expected, FAST.sink_max_backoff), gaps
    # After the delivery: the enqueuer's interval again, not the backoff.
    assert within_jitter(clock.pauses[-1:], [FAST.interval], FAST.interval * 2)
    assert clock.staged_between[:failures] == [3] * failures  # nothing left the outbox
    assert clock.staged_between[-1] == 0

    # The lost confirm put each job on the queue twice; the consumer runs each once.
    messages = drain(broker_url(), queue)
    assert [p.message_id for p, _ in messages] == keys + keys
    assert consume(db.store, messages) == keys

    said = [r for r in caplog.records if r.name == "idempotence.maintenance.enqueuer"]
    warnings = [r for r in said if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "stay staged" in warnings[0].getMessage(), warnings
    recovered = [r.getMessage() for r in said if "takes staged jobs again" in r.getMessage()]
    assert recovered == [f"the sink takes staged jobs again, after {failures} failed attempt(s)"]


def test_the_generated_sync_enqueuer_backs_off_as_well(db: Backend) -> None:
    stage(db.store, 1)
    pauses: list[float] = []
    stop = threading.Event()

    def sleep(seconds: float, stopping: threading.Event) -> None:
        pauses.append(seconds)
        if len(pauses) == 4:
            stop.set()

    sink = RabbitMQSink(closed_port_url(), timeout=2)
    Enqueuer(db.store, FAST, sink=sink, sleep=sleep).run_forever(stop)
    assert within_jitter(pauses, [0.5, 1, 2, 4], FAST.sink_max_backoff), pauses
    assert db.count("idempotence_staged_jobs") == 1


def test_the_backoff_is_bounded_and_refuses_what_cannot_work() -> None:
    import random

    from idempotence import ConfigurationError
    from idempotence.maintenance._enqueuer_shared import SinkBackoff

    backoff = SinkBackoff(EnqueuerConfig(sink_backoff=0.5, sink_max_backoff=30.0), random.Random(7))
    waits = [backoff.failed() for _ in range(2000)]  # a long outage: no overflow
    assert max(waits) <= 30.0 and min(waits[10:]) >= 30.0 * 0.75
    # Still jittered at the cap, so that many nodes' enqueuers drift apart.
    assert len(set(waits[10:])) > 1000
    assert backoff.succeeded() == 2000
    assert 0.5 * 0.75 <= backoff.failed() <= 0.5 * 1.25  # reset by a delivery
    with pytest.raises(ConfigurationError, match="sink_max_backoff"):
        EnqueuerConfig(sink_backoff=5.0, sink_max_backoff=1.0)
    with pytest.raises(ConfigurationError, match="sink_backoff"):
        EnqueuerConfig(sink_backoff=0.0)


@pytest.mark.slow
def test_the_async_enqueuer_loses_no_job_through_a_broker_restart(db: Backend) -> None:
    """The worker's async enqueuer running, its broker (a node of the test's own)
    stopped and started: every job ends on the queue, none twice to the consumer."""
    node = OwnNode()
    node.start()
    queue = "receipts"
    sink = AsyncRabbitMQSink(node.url, routes={"receipt": queue}, timeout=3)
    config = EnqueuerConfig(batch_pause=0.0, interval=0.05, sink_backoff=0.05, sink_max_backoff=0.5)
    signals = Signals()
    enqueuer = AsyncEnqueuer(db.open_async(), config, sink=sink, signals=signals)
    stop = asyncio.Event()
    running = asyncio.run_coroutine_threadsafe(enqueuer.run_forever(stop), db.loop.loop)
    try:
        first = stage(db.store, 2)
        eventually(lambda: db.count("idempotence_staged_jobs") == 0, "the first jobs went")
        node.stop()
        second = stage(db.store, 2)
        signals.wait("enqueuer.backoff", timeout=30)  # an attempt failed
        signals.wait("enqueuer.backoff", timeout=30)  # and the next, after a backoff
        assert db.count("idempotence_staged_jobs") == 2  # nothing left the outbox
        node.start()
        eventually(
            lambda: db.count("idempotence_staged_jobs") == 0, "the second jobs went", timeout=60
        )
    finally:
        db.loop.loop.call_soon_threadsafe(stop.set)
        running.result(timeout=30)
        db.loop.run(sink.close())
    try:
        # Persistent messages in a durable queue: the first two survived the restart.
        messages = drain(node.url, queue)
        assert {p.message_id for p, _ in messages} == set(first + second)
        # A batch cut by the stop may have reached the queue before its confirm was
        # lost: it went twice, and the guarded consumer runs it once.
        assert sorted(consume(db.store, messages)) == sorted(first + second)
    finally:
        node.remove()


# -- idempotence worker --async --sink ---------------------------------------------------


class SyncSink:
    """A sink of the user's own, written for the sync worker."""

    def deliver(self, store: Any, tx: Any, jobs: Sequence[StagedJob]) -> list[str]:
        return [job.job_key for job in jobs]


SYNC_SINK = SyncSink()


def _worker(db: Backend, *extra: str) -> subprocess.Popen[str]:
    cli = Path(sys.executable).parent / "idempotence"
    env = {k: v for k, v in os.environ.items() if k != "IDEMPOTENCE_DATABASE_URL"}
    return subprocess.Popen(
        [str(cli), "worker", "--database", db.url, "--interval", "0.1", *extra],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_async_worker_sends_staged_jobs_to_the_sink_it_is_given(
    db: Backend, queue: str
) -> None:
    keys = stage(db.store, 2, name=queue)  # the job's name routes it: to the test's queue
    proc = _worker(db, "--async", "--sink", broker_url().replace("/%2F", "//"))
    try:
        eventually(
            lambda: db.count("idempotence_staged_jobs") == 0 or proc.poll() is not None,
            "the worker delivered the jobs",
            timeout=30,
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert db.count("idempotence_staged_jobs") == 0, err
    assert [p.message_id for p, _ in drain(broker_url(), queue)] == keys
    assert db.count("idempotence_jobs") == 0  # not the built-in table


def test_a_sink_of_the_wrong_kind_is_refused_before_the_worker_starts(db: Backend) -> None:
    proc = _worker(db, "--async", "--sink", f"{__name__}:SYNC_SINK")
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()  # it started: the test fails below
        _, err = proc.communicate()
    assert proc.returncode == 2, err
    assert "async def deliver(self, store, tx, jobs)" in err, err
