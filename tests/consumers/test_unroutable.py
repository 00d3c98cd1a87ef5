"""A copy no queue takes never costs its message (M1, DESIGN 9), on a real RabbitMQ.

The consumer runs with ``declare=False`` on a queue whose delay and dead-letter queues
were never declared: the copy a failed message needs (requeue, M2) and the one a
hostile message needs (dead letter, M3) are published ``mandatory`` and returned by
the broker as unroutable, then confirmed. An adapter that took that confirm for a
delivery acked the original and lost the message (aio-pika did: its channel resolved
a returned publish as published). Each adapter must see the return, leave the
original unacked (back to its queue), log why, and go on; once the queues are
declared, both messages reach the dead-letter queue: nothing was lost.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest

from idempotence.consumers import Consumer, MessageContext
from tests.consumers.broker import Broker, unique_queue
from tests.consumers.running import Settled, running
from tests.support import polling

#: The slow tier, as the other suites on a real broker.
pytestmark = pytest.mark.slow

eventually = functools.partial(polling.eventually, timeout=60.0, interval=0.05)


@pytest.fixture
def bare_queue(amqp_url: str) -> Iterator[tuple[Broker, str]]:
    """A work queue alone: no delay queue, no dead-letter queue."""
    broker = Broker(amqp_url)
    queue = unique_queue("idem-unroutable")
    broker.channel.queue_declare(queue, durable=True)
    try:
        yield broker, queue
    finally:
        broker.delete(queue)
        broker.close()


def _fail(ctx: MessageContext) -> None:
    raise RuntimeError(f"cannot process {ctx.key}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("adapter", ["pika", "aio"])
def test_a_returned_copy_leaves_its_message_in_the_queue(
    amqp_url: str,
    consumer_sqlite_path: str,
    adapter: str,
    bare_queue: tuple[Broker, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker, queue = bare_queue
    consumer = Consumer(
        name="unroutable", handler=_fail, max_attempts=2, retry_delay=timedelta(milliseconds=100)
    )
    settled: Settled = []
    caplog.set_level(logging.WARNING, logger="idempotence.consumers")
    broker.publish(queue, b"failing", "failing")  # its handler raises: requeued (M2)
    broker.publish(queue, b"hostile")  # no message id: dead-lettered (M3)

    def handled(body: bytes) -> int:
        return sum(1 for message, _ in settled if message.body == body)

    # Prefetch 2: a nacked delivery goes back to the head of the queue, and with
    # prefetch 1 it would be the only one handled until its copy's queue exists.
    options = {"declare": False, "reconnect_delay": 0.1, "prefetch": 2}
    with running(adapter, consumer, consumer_sqlite_path, amqp_url, queue, settled, **options):
        # Each copy is returned, and its original comes back: handled again and again.
        eventually(
            lambda: handled(b"failing") >= 3 and handled(b"hostile") >= 3,
            what=lambda: f"both back: {handled(b'failing')} and {handled(b'hostile')} handlings",
        )
        # Once the queues exist, the copies go out and both messages end dead-lettered.
        broker.declare(queue)
        eventually(lambda: broker.count(f"{queue}.dead") == 2, what="both dead letters")
    assert broker.count(queue) == 0 and broker.count(f"{queue}.delay") == 0
    dead = sorted(body for _, body in broker.drain(f"{queue}.dead"))
    assert dead == [b"failing", b"hostile"]
    logged = [r.getMessage() for r in caplog.records]
    refused = [line for line in logged if "the broker refused the copy" in line]
    assert any(f"{queue}.delay" in line and "NO_ROUTE" in line for line in refused), logged
    assert any(f"{queue}.dead" in line and "NO_ROUTE" in line for line in refused), logged
    assert not [line for line in logged if "connection lost" in line]
