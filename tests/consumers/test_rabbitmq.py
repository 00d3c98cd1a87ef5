"""The guard on a real RabbitMQ, with both adapters in the test process: M2 (a twin in
progress is requeued, never acked before done), M3 (poison), hostile messages, a
broker restarted mid-run, graceful shutdown (DESIGN 9)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from idempotence.consumers import Action, Consumer, Message, MessageContext
from idempotence.consumers._rabbitmq import ATTEMPT_HEADER, REASON_HEADER
from idempotence.maintenance import admin
from idempotence.states import KeyState
from tests.consumers.broker import Broker, OwnNode, queue_for_test
from tests.consumers.running import Settled, running, sync_store
from tests.support import polling

#: The slow tier: consumers on a real broker, restarts included.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: A broker delivers, redelivers and dead-letters within a minute on a loaded machine.
eventually = functools.partial(polling.eventually, timeout=60.0, interval=0.05)


def _mark(url: str) -> str:
    return "%s" if url.startswith("postgres") else "?"


def _effects(url: str, key: str | None = None) -> int:
    with sync_store(url) as store, store.transaction() as tx:
        if key is None:
            row = tx.execute("SELECT count(*) AS n FROM effects")[0]
        else:
            row = tx.execute(
                f"SELECT count(*) AS n FROM effects WHERE message_id = {_mark(url)}", (key,)
            )[0]
        return int(dict(row)["n"])


def _writer(
    url: str,
    *,
    slow: dict[str, float] | None = None,
    fail: set[str] | None = None,
    on_loop: bool = False,
) -> Any:
    """A handler writing one effect in the claim's transaction (or, in handler mode,
    in a transaction of its own), slow or failing for the keys named. ``on_loop``: an
    async handler, for the aio-pika consumer, whose event loop must stay free for the
    heartbeats (F2) while the handler is slow."""
    insert = f"INSERT INTO effects (message_id, pid) VALUES ({_mark(url)}, {_mark(url)})"

    def own_transaction(ctx: MessageContext) -> None:
        with sync_store(url) as store, store.transaction() as tx:
            tx.execute(insert, (ctx.key, os.getpid()))

    def handle(ctx: MessageContext) -> None:
        if fail and ctx.key in fail:
            raise RuntimeError(f"cannot process {ctx.key}")
        if slow and ctx.key in slow:
            time.sleep(slow.pop(ctx.key))
        if ctx.tx is None:
            own_transaction(ctx)
        else:
            ctx.tx.execute(insert, (ctx.key, os.getpid()))

    async def handle_async(ctx: MessageContext) -> None:
        if fail and ctx.key in fail:
            raise RuntimeError(f"cannot process {ctx.key}")
        if slow and ctx.key in slow:
            await asyncio.sleep(slow.pop(ctx.key))
        if ctx.tx is None:
            own_transaction(ctx)
        else:
            await ctx.tx.execute(insert, (ctx.key, os.getpid()))

    return handle_async if on_loop else handle


# -- M2: two consumers racing the same redelivered message ----------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["transaction", "handler"])
def test_m2_two_consumers_racing_one_message_make_one_effect(
    amqp_url: str, consumer_store_url: str, mode: str
) -> None:
    """Consumer A holds the message (its handler outlives the lock timeout: only the
    heartbeats keep it, F2); the redelivered copy reaches consumer B, which must
    neither run it nor ack it before A is done: it requeues it (M2), and the copy
    comes back as a duplicate, absorbed."""
    url = consumer_store_url
    # A handler-mode store waits for nothing; a SQLite transaction holds the one write
    # lock, so there B waits and then finds the message done.
    slow = {"the-message": 2.0}  # whichever consumer gets it first

    def consumer(on_loop: bool) -> Consumer:
        return Consumer(
            name="race",
            handler=_writer(url, slow=slow, on_loop=on_loop),
            transactional=mode == "transaction",
            lock_timeout=timedelta(seconds=0.6),
            retry_delay=timedelta(milliseconds=300),
        )

    acked_early: list[str] = []

    def check_done(message: Message, disposition: Any) -> None:
        # M1/M2: an ack (or anything but a requeue) only once the key is finished.
        if disposition.action is Action.ACK:
            with sync_store(url) as store:
                record = store.get("race", "the-message")
            if record is None or not record.finished:
                acked_early.append(disposition.outcome)

    settled: Settled = []
    with queue_for_test(amqp_url) as (broker, queue):
        with (
            running("pika", consumer(False), url, amqp_url, queue, settled, check_done, prefetch=1),
            running("aio", consumer(True), url, amqp_url, queue, settled, check_done, prefetch=1),
        ):
            eventually(lambda: _consumers(broker, queue) == 2, what="two consumers")
            broker.publish(queue, b"{}", "the-message")
            time.sleep(0.3)  # A has it, and is in its handler
            broker.publish(queue, b"{}", "the-message")  # the redelivery
            eventually(
                lambda: acked_early or {"processed", "duplicate"} <= {d.outcome for _, d in settled}
            )
            eventually(lambda: not broker.count(queue) and not broker.count(queue + ".delay"))
        outcomes = sorted(d.outcome for _, d in settled)
        assert _effects(url) == 1, outcomes
        assert not acked_early, f"acked before the key was done: {acked_early}"
        assert outcomes.count("processed") == 1
        assert "duplicate" in outcomes
        if not url.endswith("sqlite3") or mode == "handler":
            assert "in_progress" in outcomes, outcomes


def test_m1_batched_acks_follow_the_commits_and_none_is_left_once_idle(
    amqp_url: str, consumer_sqlite_path: str
) -> None:
    """The pika adapter acks settled deliveries together (``multiple``): a delivery is
    never acked before its commit (M1), and once nothing waits in the client's buffer
    every settled one is acked; 37 messages leave an odd batch at the end."""
    url = consumer_sqlite_path
    consumer = Consumer(name="batched", handler=_writer(url), transactional=True)
    acked_early: list[str] = []

    def check_done(message: Message, disposition: Any) -> None:
        with sync_store(url) as store:
            record = store.get("batched", str(message.message_id))
        if record is None or not record.finished:
            acked_early.append(str(message.message_id))

    settled: Settled = []
    with queue_for_test(amqp_url) as (broker, queue):
        for i in range(37):
            broker.publish(queue, b"{}", f"m-{i}")
        with running("pika", consumer, url, amqp_url, queue, settled, check_done, prefetch=16):
            eventually(lambda: len(settled) == 37, what="37 settled deliveries")
            # Idle, still consuming: the last batch went out without a stop.
            eventually(lambda: broker.unacked(queue) == 0, what="every delivery acked")
        assert broker.count(queue) == 0
    assert not acked_early, f"settled before the commit: {acked_early}"
    assert _effects(url) == 37
    assert {d.outcome for _, d in settled} == {"processed"}


def test_m1_a_dead_lettered_delivery_is_acked_at_once_with_those_before_it(
    amqp_url: str, consumer_sqlite_path: str
) -> None:
    """A delivery the pika adapter forwarded (here dead-lettered: no id) is acked as
    soon as its copy is confirmed, not with a later batch, so a crash cannot leave two
    copies of more than that one; the batch settled before it goes with it."""
    url = consumer_sqlite_path
    consumer = Consumer(name="forwarded", handler=_writer(url), transactional=True)
    unacked: list[int] = []

    def after_the_copy(message: Message, disposition: Any) -> None:
        if message.message_id == "after-0":  # before its own ack
            unacked.append(broker.unacked(queue))

    settled: Settled = []
    with queue_for_test(amqp_url) as (broker, queue):
        for i in range(5):
            broker.publish(queue, b"{}", f"before-{i}")
        broker.publish(queue, b"{}")  # no message id: hostile, dead-lettered
        for i in range(5):
            broker.publish(queue, b"{}", f"after-{i}")
        with running("pika", consumer, url, amqp_url, queue, settled, prefetch=16,
                     hook=after_the_copy):  # fmt: skip
            eventually(lambda: len(settled) == 11, what="11 settled deliveries")
            eventually(lambda: broker.unacked(queue) == 0, what="every delivery acked")
        assert broker.count(queue + ".dead") == 1
    # All 11 were delivered at once (prefetch 16): the 5 after the copy are unacked.
    assert unacked == [5]


def _consumers(broker: Broker, queue: str) -> int:
    return int(broker.channel.queue_declare(queue, passive=True).method.consumer_count)


# -- M3: poison ----------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("adapter", ["pika", "aio"])
def test_m3_poison_message_is_dead_lettered_with_its_key_errored(
    amqp_url: str, consumer_pg_url: str, adapter: str
) -> None:
    url = consumer_pg_url
    consumer = Consumer(
        name="poison",
        handler=_writer(url, fail={"bad"}, on_loop=adapter == "aio"),
        transactional=True,
        max_attempts=3,
        retry_delay=timedelta(milliseconds=100),
    )
    settled: Settled = []
    with queue_for_test(amqp_url) as (broker, queue):
        with running(adapter, consumer, url, amqp_url, queue, settled):
            for i in range(10):
                broker.publish(queue, b"{}", f"good-{i}")
            broker.publish(queue, b"{}", "bad")
            for i in range(10, 20):
                broker.publish(queue, b"{}", f"good-{i}")
            eventually(lambda: broker.count(queue + ".dead") == 1, what="the dead letter")
            eventually(lambda: _effects(url) == 20, what="the other messages")
        ((properties, _body),) = broker.drain(queue + ".dead")
        assert properties.message_id == "bad"
        assert properties.headers[ATTEMPT_HEADER] == 3
        assert "3 failed attempts" in properties.headers[REASON_HEADER]
        assert not broker.count(queue) and not broker.count(queue + ".delay")
    outcomes = [d.outcome for m, d in settled if m.message_id == "bad"]
    assert outcomes == ["retry", "retry", "dead_letter"]
    with sync_store(url) as store:
        errored = admin.list_keys(store, scope="poison", state=KeyState.ERRORED)
        assert [row.record.key for row in errored] == ["bad"]
        assert "RuntimeError" in (errored[0].record.error or "")
        assert len(admin.list_keys(store, scope="poison", state=KeyState.COMPLETE)) == 20


# -- hostile messages --------------------------------------------------------------------------


def _json_id(message: Message) -> str | None:
    return json.loads(message.body.decode("utf-8")).get("id")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("adapter", ["pika", "aio"])
def test_hostile_messages_are_dead_lettered_and_the_consumer_keeps_running(
    amqp_url: str, consumer_sqlite_path: str, adapter: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = consumer_sqlite_path
    consumer = Consumer(
        name="hostile",
        handler=_writer(url, on_loop=adapter == "aio"),
        transactional=True,
        message_id=_json_id,
        decode="json",
    )
    settled: Settled = []
    caplog.set_level(logging.ERROR, logger="idempotence.consumers")
    with queue_for_test(amqp_url) as (broker, queue):
        with running(adapter, consumer, url, amqp_url, queue, settled) as thread:
            broker.publish(queue, b'{"no": "id"}')
            broker.publish(queue, json.dumps({"id": "x" * 10_000}).encode())
            broker.publish(queue, b'{"id": "\xff\xfe"}')
            broker.publish(queue, json.dumps({"id": "fine"}).encode())
            eventually(lambda: _effects(url) == 1, what="the good message")
            eventually(lambda: broker.count(queue + ".dead") == 3, what="three dead letters")
            assert thread.is_alive()
        reasons = [p.headers[REASON_HEADER] for p, _ in broker.drain(queue + ".dead")]
    assert reasons == [
        "hostile message: it has no message id",
        "hostile message: its message id (10000 characters) is no valid key: The message "
        "id is too long: 10000 characters, max 255.",
        "hostile message: its id could not be derived: "
        "UnicodeDecodeError('utf-8', b'{\"id\": \"\\xff\\xfe\"}', 8, 9, 'invalid start byte')",
    ]
    logged = [r.getMessage() for r in caplog.records if "dead-lettering" in r.getMessage()]
    assert len(logged) == 3
    assert all("hostile message" in line for line in logged)


# -- graceful shutdown ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("adapter", ["pika", "aio"])
def test_sigterm_finishes_the_current_message_and_stops(
    amqp_url: str, consumer_pg_url: str, adapter: str, tmp_path: Path
) -> None:
    """SIGTERM while a message is in its handler: that message is finished and acked,
    the consumer stops consuming and exits 0, and the prefetched ones go back."""
    env = {
        **os.environ,
        "IDEM_SLOW": "1.5",
        "IDEM_MARKERS": str(tmp_path),
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
    }
    with queue_for_test(amqp_url) as (broker, queue):
        for i in range(3):
            broker.publish(queue, b"{}", f"m-{i}")
        args = [adapter, "transaction", consumer_pg_url, queue, amqp_url]
        proc = subprocess.Popen([sys.executable, "-m", "tests.consumers.worker", *args], env=env)
        try:
            eventually(lambda: (tmp_path / "started-m-0").exists(), what="the first message")
            assert (tmp_path / f"ready-{proc.pid}").exists()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        assert _effects(consumer_pg_url) == 1
        assert _effects(consumer_pg_url, "m-0") == 1
        assert broker.count(queue) == 2  # not consumed, not lost
        assert broker.count(queue + ".dead") == 0


# -- the broker restarted mid-run ------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_broker_restarted_mid_run_consumers_reconnect(
    consumer_pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A RabbitMQ node of the test's own is stopped and started again while both
    adapters consume from it: they reconnect; nothing is lost, nothing doubled."""
    url, total = consumer_pg_url, 200
    caplog.set_level(logging.WARNING, logger="idempotence.consumers")
    node = OwnNode()
    try:
        node.start()
        settled: Settled = []
        slow = {f"m-{i}": 0.1 for i in range(total)}

        def consumer(on_loop: bool) -> Consumer:
            handler = _writer(url, slow=slow, on_loop=on_loop)
            return Consumer(name="restart", handler=handler, transactional=True)

        broker = Broker(node.url)
        broker.declare("restart")
        for i in range(total):
            broker.publish("restart", b"{}", f"m-{i}")
        broker.close()
        options = {"reconnect_delay": 0.5}
        with (
            running("pika", consumer(False), url, node.url, "restart", settled, **options),
            running("aio", consumer(True), url, node.url, "restart", settled, **options),
        ):
            eventually(lambda: _effects(url) >= 10, what="the first messages")
            node.stop()
            assert _effects(url) < total, "too late: every message was processed already"
            time.sleep(1)
            node.start()
            eventually(lambda: _distinct(url) == total, timeout=120, what="every message")
            broker = Broker(node.url)
            eventually(lambda: not broker.count("restart") and not broker.count("restart.delay"))
        assert broker.count("restart") == 0  # the consumers stopped: nothing was unacked
        broker.close()
    finally:
        node.remove()
    assert _effects(url) == total
    lost = [r for r in caplog.records if "connection lost, reconnecting" in r.getMessage()]
    assert len(lost) >= 2, "both consumers must have lost their connection"


def _distinct(url: str) -> int:
    with sync_store(url) as store, store.transaction() as tx:
        return int(dict(tx.execute("SELECT count(DISTINCT message_id) AS n FROM effects")[0])["n"])
