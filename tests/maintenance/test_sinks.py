"""Staged jobs delivered to RabbitMQ and to Celery by the enqueuer (B4, R7, DESIGN 12):
a job leaves the outbox only once the broker confirmed it; a broker that is down or
restarted loses none (they stay staged and go at a later pass); the job key is the
message's id, so a guarded consumer absorbs a repeat. Real brokers: the machine's
RabbitMQ, and a node of the test's own for the restart.

Each test that takes ``flavour`` runs the sync sinks on the sync enqueuer and the async
sinks (aio-pika; Celery on a worker thread) on the async enqueuer they are generated
from (F7). The backoff while a broker is away is in test_sink_backoff.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pika
import pytest

from idempotence import ConfigurationError
from idempotence.maintenance import Enqueuer, EnqueuerConfig
from idempotence.maintenance.sinks import BrokerUnavailable, CelerySink, RabbitMQSink
from idempotence.states import StagedJob
from tests.consumers.broker import OwnNode, broker_url
from tests.maintenance.brokers import celery_app, closed_port_url, consume, drain, sink_of
from tests.maintenance.support import Backend, Flavour, new_scope
from tests.maintenance.test_enqueuer import stage

# The slow tier: the worker's process and a real broker, stopped and restarted.
pytestmark = pytest.mark.slow

FAST = EnqueuerConfig(batch_pause=0.0)


def test_rabbitmq_sink_publishes_each_job_persistent_with_its_key_as_message_id(
    db: Backend, flavour: Flavour, queue: str
) -> None:
    # Two batches: the async sink sends a batch's messages without waiting for each
    # confirm in turn, and they must still reach the queue in order.
    keys = stage(db.store, 130)
    with sink_of(flavour, RabbitMQSink, broker_url(), routes={"receipt": queue}) as sink:
        result = flavour(Enqueuer, FAST, sink=sink).run_once()
    assert (result.delivered, result.batches) == (tuple(keys), 2)
    assert db.count("idempotence_staged_jobs") == 0
    messages = drain(broker_url(), queue)
    assert [p.message_id for p, _ in messages] == keys
    assert all(p.delivery_mode == 2 and p.type == "receipt" for p, _ in messages)
    assert all(p.content_type == "application/json" for p, _ in messages)
    assert [json.loads(body) for _, body in messages] == [{"n": n} for n in range(130)]


def test_the_default_virtual_host_may_be_written_as_celery_writes_it(
    db: Backend, flavour: Flavour, queue: str
) -> None:
    keys = stage(db.store, 1)
    url = broker_url().replace("/%2F", "//")
    with sink_of(flavour, RabbitMQSink, url, routes={"receipt": queue}) as sink:
        assert flavour(Enqueuer, FAST, sink=sink).run_once().delivered == tuple(keys)
    assert [p.message_id for p, _ in drain(broker_url(), queue)] == keys


def test_a_broker_that_is_down_leaves_every_job_staged(
    db: Backend, flavour: Flavour, queue: str
) -> None:
    keys = stage(db.store, 3)
    with (
        sink_of(flavour, RabbitMQSink, closed_port_url(), timeout=2) as down,
        pytest.raises(BrokerUnavailable, match="stay staged"),
    ):
        flavour(Enqueuer, FAST, sink=down).run_once()
    assert db.count("idempotence_staged_jobs") == 3
    with sink_of(flavour, RabbitMQSink, broker_url(), routes={"receipt": queue}) as sink:
        assert flavour(Enqueuer, FAST, sink=sink).run_once().delivered == tuple(keys)
    assert [p.message_id for p, _ in drain(broker_url(), queue)] == keys


def test_a_message_nobody_can_receive_is_refused_not_dropped(db: Backend, flavour: Flavour) -> None:
    """aio-pika confirms a message the broker returned unless told otherwise: the
    async sink must refuse it as the sync one does."""
    stage(db.store, 1)
    # An exchange with no queue bound: the broker returns the message (mandatory).
    connection = pika.BlockingConnection(pika.URLParameters(broker_url()))
    exchange = f"idem-sink-x-{uuid.uuid4().hex[:8]}"
    connection.channel().exchange_declare(exchange, "direct", auto_delete=False)
    try:
        with (
            sink_of(flavour, RabbitMQSink, broker_url(), exchange=exchange) as sink,
            pytest.raises(BrokerUnavailable, match="stay staged"),
        ):
            flavour(Enqueuer, FAST, sink=sink).run_once()
        assert db.count("idempotence_staged_jobs") == 1
    finally:
        connection.channel().exchange_delete(exchange)
        connection.close()


def test_a_duplicate_from_a_lost_confirm_is_absorbed_by_a_guarded_consumer(
    db: Backend, flavour: Flavour, queue: str
) -> None:
    """A lost confirm delivers a job twice: the same message id twice. A consumer keyed
    by the message id runs its handler once."""
    keys = stage(db.store, 2)
    with sink_of(flavour, RabbitMQSink, broker_url(), routes={"receipt": queue}) as sink:
        flavour(Enqueuer, FAST, sink=sink).run_once()
        # The second delivery of the same jobs, as after a confirm lost in transit.
        lease = db.store.claim(_request(new_scope())).lease
        assert lease is not None
        with db.store.transaction() as tx:
            db.store.stage_jobs(tx, lease, [(key, "receipt", {"again": True}) for key in keys])
        flavour(Enqueuer, FAST, sink=sink).run_once()
    messages = drain(broker_url(), queue)
    assert [p.message_id for p, _ in messages] == keys + keys
    assert consume(db.store, messages) == keys


def _request(scope: str) -> Any:
    from idempotence import ClaimRequest

    return ClaimRequest(scope=scope, key=f"again-{uuid.uuid4().hex[:6]}", fingerprint="f")


@pytest.mark.slow
def test_a_broker_restart_loses_no_job(db: Backend) -> None:
    node = OwnNode()
    node.start()
    queue = "receipts"
    sink = RabbitMQSink(node.url, routes={"receipt": queue}, timeout=3)
    try:
        first = stage(db.store, 2)
        assert Enqueuer(db.store, FAST, sink=sink).run_once().delivered == tuple(first)
        node.stop()
        second = stage(db.store, 2)
        with pytest.raises(BrokerUnavailable):
            Enqueuer(db.store, FAST, sink=sink).run_once()
        assert db.count("idempotence_staged_jobs") == 2  # nothing left the outbox
        node.start()
        assert Enqueuer(db.store, FAST, sink=sink).run_once().delivered == tuple(second)
        # Persistent messages in a durable queue: the first two survived the restart.
        assert [p.message_id for p, _ in drain(node.url, queue)] == first + second
    finally:
        sink.close()
        node.remove()


def test_celery_sink_sends_each_job_as_a_task_whose_id_is_the_job_key(
    db: Backend, flavour: Flavour, queue: str
) -> None:
    keys = stage(db.store, 2)
    app = celery_app(broker_url())
    try:
        tasks = {"receipt": "shop.send_receipt"}
        with sink_of(flavour, CelerySink, app, tasks=tasks, queue=queue) as sink:
            assert flavour(Enqueuer, FAST, sink=sink).run_once().delivered == tuple(keys)
    finally:
        app.close()
    messages = drain(broker_url(), queue)
    assert [p.headers["id"] for p, _ in messages] == keys
    assert {p.headers["task"] for p, _ in messages} == {"shop.send_receipt"}
    assert [json.loads(body)[1] for _, body in messages] == [{"n": 0}, {"n": 1}]  # kwargs


def test_celery_sink_needs_confirms_and_keeps_jobs_staged_while_the_broker_is_down(
    db: Backend, flavour: Flavour
) -> None:
    unconfirmed = celery_app(broker_url(), confirm=False)
    with (
        pytest.raises(ConfigurationError, match="confirm_publish"),
        sink_of(flavour, CelerySink, unconfirmed),
    ):
        pass
    stage(db.store, 2)
    app = celery_app(closed_port_url())
    try:
        with (
            sink_of(flavour, CelerySink, app) as sink,
            pytest.raises(BrokerUnavailable, match="stay staged"),
        ):
            flavour(Enqueuer, FAST, sink=sink).run_once()
    finally:
        app.close()
    assert db.count("idempotence_staged_jobs") == 2


# -- idempotence worker --sink ----------------------------------------------------------------


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


@pytest.mark.parametrize("kind", [[], ["--async"]], ids=["sync", "async"])
def test_the_worker_sends_staged_jobs_to_the_sink_it_is_given(
    db: Backend, queue: str, kind: list[str]
) -> None:
    keys = stage(db.store, 2, name=queue)  # the job's name routes it: to the test's queue
    url = broker_url().replace("/%2F", "//")
    proc = _worker(db, *kind, "--sink", url)
    try:
        deadline = time.monotonic() + 30
        while db.count("idempotence_staged_jobs") > 0:
            assert proc.poll() is None, proc.communicate()
            if time.monotonic() > deadline:
                proc.send_signal(signal.SIGTERM)
                raise AssertionError(f"the worker delivered nothing:\n{proc.communicate()[1]}")
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "runs no jobs" not in err  # it has a sink
    assert [p.message_id for p, _ in drain(broker_url(), queue)] == keys
    assert db.count("idempotence_jobs") == 0  # not the built-in table


def test_a_worker_without_runner_or_sink_says_so_once(db: Backend) -> None:
    proc = _worker(db)
    assert proc.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")))
    reader.start()
    deadline = time.monotonic() + 30
    while not any("enqueuer started" in line for line in list(lines)):
        assert time.monotonic() < deadline, "".join(lines)
        time.sleep(0.05)
    time.sleep(0.5)  # five passes of every service: still one warning
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    reader.join(timeout=30)
    err = "".join(lines)
    assert err.count("runs no jobs (no --jobs) and has no --sink") == 1, err


class SyncSink:
    """A sink of the user's own, written for the sync worker."""

    def deliver(self, store: Any, tx: Any, jobs: Sequence[StagedJob]) -> list[str]:
        return [job.job_key for job in jobs]


SYNC_SINK = SyncSink()


def test_a_sink_of_the_other_kind_is_refused_before_the_worker_starts(db: Backend) -> None:
    proc = _worker(db, "--async", "--sink", f"{__name__}:SYNC_SINK")
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()  # it started: the test fails below
        _, err = proc.communicate()
    assert proc.returncode == 2, err
    assert "async def deliver(self, store, tx, jobs)" in err, err
