"""The enqueuer's backoff while a sink's broker is away (B4, DESIGN 12): the jobs stay
staged, the attempts come further and further apart (jittered, bounded), the outage is
logged once as it begins and once as it ends, and when the broker is back every job is
delivered, a repeat from a lost confirm absorbed by a guarded consumer. Real brokers:
the machine's RabbitMQ, behind a relay the test shuts and opens
(tests/consumers/broker.py), and a node of the test's own for the restart.

The schedule is read off a clock of the test's own: the enqueuer is handed a sleep that
records each pause and moves that clock instead of waiting, so a schedule of minutes
runs in a second, against the real broker."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator, Sequence

import pytest

from idempotence import AsyncStore, AsyncTransaction
from idempotence.maintenance import (
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
from tests.maintenance.brokers import closed_port_url, consume, drain
from tests.maintenance.support import Backend
from tests.maintenance.test_enqueuer import stage
from tests.support.polling import eventually

FAST = EnqueuerConfig(batch_pause=0.0)


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
def test_the_running_async_enqueuer_loses_no_job_through_a_broker_restart(
    pg_db: Backend,
) -> None:
    """The worker's async enqueuer running, its broker (a node of the test's own)
    stopped and started: every job ends on the queue, none twice to the consumer."""
    node = OwnNode()
    node.start()
    queue = "receipts"
    sink = AsyncRabbitMQSink(node.url, routes={"receipt": queue}, timeout=3)
    config = EnqueuerConfig(batch_pause=0.0, interval=0.05, sink_backoff=0.05, sink_max_backoff=0.5)
    signals = Signals()
    enqueuer = AsyncEnqueuer(pg_db.open_async(), config, sink=sink, signals=signals)
    stop = asyncio.Event()
    running = asyncio.run_coroutine_threadsafe(enqueuer.run_forever(stop), pg_db.loop.loop)
    try:
        first = stage(pg_db.store, 2)
        eventually(lambda: pg_db.count("idempotence_staged_jobs") == 0, "the first jobs went")
        node.stop()
        second = stage(pg_db.store, 2)
        signals.wait("enqueuer.backoff", timeout=30)  # an attempt failed
        signals.wait("enqueuer.backoff", timeout=30)  # and the next, after a backoff
        assert pg_db.count("idempotence_staged_jobs") == 2  # nothing left the outbox
        node.start()
        eventually(
            lambda: pg_db.count("idempotence_staged_jobs") == 0, "the second jobs went", timeout=60
        )
    finally:
        pg_db.loop.loop.call_soon_threadsafe(stop.set)
        running.result(timeout=30)
        pg_db.loop.run(sink.close())
    try:
        # Persistent messages in a durable queue: the first two survived the restart.
        messages = drain(node.url, queue)
        assert {p.message_id for p, _ in messages} == set(first + second)
        # A batch cut by the stop may have reached the queue before its confirm was
        # lost: it went twice, and the guarded consumer runs it once.
        assert sorted(consume(pg_db.store, messages)) == sorted(first + second)
    finally:
        node.remove()
