"""Receipts through RabbitMQ (``idempotence demo --broker amqp://…``), consumed by a
guarded consumer (DESIGN 9).

Without a broker, the job runner's ``send_receipt`` job calls the fake mailer. With
one:

* the job **publishes** the receipt to a queue of the run's own (`run_queue`),
  the message id derived from the ride (``ride-<id>-receipt``), with publisher
  confirms. A publish that fails fails the job, and the runner runs it again: a
  publisher retry, which may publish the message twice. The chaos run also publishes
  some receipts twice on purpose (``--duplicate-rate``);
* **consumer processes** (forked by the stack's supervisor, restarted when they die) run
  [`PikaConsumer`][idempotence.consumers.rabbitmq_pika.PikaConsumer] over a
  transactional [`Consumer`][idempotence.consumers.rabbitmq_pika.Consumer]: the receipt
  row (``rocket_receipts``, no unique constraint, so a second receipt would show) and
  the processed mark commit in one transaction (F3), and the ack is sent only after the
  commit (M1). The chaos run SIGKILLs them mid-message: before the claim, inside the
  transaction, or after the commit and before the ack;
* every process appends what it did to the run's **ledger** (JSON lines): each job's
  published copies, each settled delivery. `tally` turns it into the report's
  numbers. Every copy carries an id of its own in a header, so the run can wait until
  every copy it published was settled, duplicates included.

The library does the guarding; nothing here deduplicates anything. pika and aio-pika
are imported only when a broker is used: the demo without one needs neither.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import secrets
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idempotence.consumers import Consumer, Disposition, Message, MessageContext
from idempotence.database import open_sql_store
from idempotence.maintenance import Job, JobRegistry

from .mailer import Receipt
from .report import MessageCounts
from .schema import fetch

if TYPE_CHECKING:
    import aio_pika.abc

    from .stack import StackConfig

__all__ = [
    "CONSUMER",
    "BrokerConfig",
    "BrokerUnavailable",
    "Ledger",
    "Publisher",
    "consume",
    "receipt_id",
    "receipts",
    "run_queue",
    "tally",
]

logger = logging.getLogger("rocket_rides.broker")

CONSUMER = "rocket_receipts"
"""The guarded consumer's name, and so the scope of its keys
(``idempotence keys list --scope rocket_receipts``)."""
COPY_HEADER = "x-rocket-copy"
"""The header that tells the copies of one message apart (a requeue keeps it)."""
KILL_POINTS = ("before_claim", "in_transaction", "after_settle")
"""Where a delivery's consumer may die (the chaos run): before the claim, after the
receipt row is written and before the commit, after the commit and before the ack."""
_FINAL = frozenset({"processed", "duplicate", "dead_letter"})
"""The outcomes that end a copy's life (a requeue makes a new delivery of it)."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """The run's broker, queue and chaos (part of the stack's JSON config)."""

    url: str
    queue: str
    consumers: int = 2
    crash_rate: float = 0.0
    """Probability per delivery that the consumer handling it is SIGKILLed."""
    duplicate_rate: float = 0.0
    """Probability per receipt that it is published twice on purpose."""
    prefetch: int = 4


class BrokerUnavailable(Exception):
    """The broker did not answer."""


def receipt_id(ride_id: int) -> str:
    """The receipt message's id: derived from the ride, the same on every publish."""
    return f"ride-{ride_id}-receipt"


# -- the ledger --------------------------------------------------------------------------------


class Ledger:
    """What went over the broker, appended as JSON lines by every process.

    One ``write`` is one ``write(2)`` on a file opened with ``O_APPEND``: lines from
    concurrent processes never interleave, and a SIGKILL never leaves half a line.
    """

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = Path(data_dir) / "broker-ledger.jsonl"

    def write(self, **event: Any) -> None:
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def events(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line]


def tally(events: list[dict[str, Any]], consumers_killed: int = 0) -> MessageCounts:
    """The report's numbers from the ledger's ``events``."""
    jobs = [e for e in events if e["event"] == "published"]
    settled = [e for e in events if e["event"] == "settled"]
    copies = {copy for job in jobs for copy in job["copies"]}
    final = {e["copy"] for e in settled if e["outcome"] in _FINAL}
    return MessageCounts(
        published=len(copies),
        duplicates_published=sum(job["duplicates"] for job in jobs),
        redelivered=sum(1 for e in settled if e["redelivered"]),
        absorbed=sum(1 for e in settled if e["outcome"] == "duplicate"),
        unsettled=len(copies - final),
        rides_published=frozenset(job["ride"] for job in jobs),
        consumers_killed=consumers_killed,
    )


# -- the queue ---------------------------------------------------------------------------------


@contextlib.contextmanager
def run_queue(url: str) -> Iterator[str]:
    """A queue of the run's own on the broker at ``url``, declared now (so that no
    receipt published before a consumer is up is lost) and deleted at the end with
    its delay and dead-letter queues. Other runs on the same broker never see it."""
    import pika
    import pika.exceptions

    queue = f"rocket_rides.receipts.{secrets.token_hex(6)}"
    try:
        connection = pika.BlockingConnection(pika.URLParameters(url))
    except pika.exceptions.AMQPError as exc:
        where = url.rpartition("@")[2]  # not the password
        raise BrokerUnavailable(f"no RabbitMQ broker answers at {where}: {exc!r}") from exc
    try:
        connection.channel().queue_declare(queue, durable=True)
    finally:
        connection.close()
    try:
        yield queue
    finally:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(url))
            channel = connection.channel()
            for name in (queue, f"{queue}.delay", f"{queue}.dead"):
                channel.queue_delete(name)
            connection.close()
        except pika.exceptions.AMQPError as exc:
            logger.warning("could not delete the run's queues %s*: %r", queue, exc)


# -- the publisher -----------------------------------------------------------------------------


class Publisher:
    """The ``send_receipt`` job of the background worker: it publishes the receipt
    (aio-pika, publisher confirms) instead of mailing it."""

    def __init__(self, config: BrokerConfig, ledger: Ledger, seed: int | None = None) -> None:
        self.config, self.ledger = config, ledger
        self._random = random.Random(seed)
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None

    def jobs(self) -> JobRegistry:
        registry = JobRegistry()
        registry.register("send_receipt")(self.send_receipt)
        return registry

    async def send_receipt(self, job: Job) -> None:
        args = job.args
        ride_id = int(args["ride_id"])
        body = {"ride_id": ride_id, "user": args["user"], "charge_id": args.get("charge_id")}
        duplicates = 1 if self._random.random() < self.config.duplicate_rate else 0
        copies = [
            await self._publish(receipt_id(ride_id), json.dumps(body).encode())
            for _ in range(1 + duplicates)
        ]
        self.ledger.write(event="published", ride=ride_id, copies=copies, duplicates=duplicates)

    async def _publish(self, message_id: str, body: bytes) -> str:
        import aio_pika

        copy = uuid.uuid4().hex
        try:
            if self._channel is None:
                self._connection = await aio_pika.connect(self.config.url)
                self._channel = await self._connection.channel(publisher_confirms=True)
            message = aio_pika.Message(
                body,
                message_id=message_id,
                headers={COPY_HEADER: copy},
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await self._channel.default_exchange.publish(message, self.config.queue, mandatory=True)
        except BaseException:
            # The job fails and the runner runs it again: if the broker had the
            # message (a lost confirm), it is published twice, and the consumer absorbs
            # the second copy.
            await self.close()
            raise
        return copy

    async def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()


# -- the consumer ------------------------------------------------------------------------------


class _Chaos:
    """Kills this consumer process at a random point of a delivery (the demo's run)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.point = rate, ""
        self._random = random.Random()

    def plan(self) -> None:
        hit = self._random.random() < self.rate
        self.point = self._random.choice(KILL_POINTS) if hit else ""

    def reached(self, point: str) -> None:
        if point == self.point:
            # SIGKILL: no rollback, no ack, no finally of ours; what an OOM kill leaves.
            os.kill(os.getpid(), signal.SIGKILL)


def consume(config: StackConfig) -> None:
    """One consumer process: receipts from the run's queue into ``rocket_receipts``,
    through the guard, until SIGTERM."""
    from idempotence.consumers.rabbitmq_pika import PikaConsumer

    broker = config.broker
    assert broker is not None
    chaos = _Chaos(broker.crash_rate if config.chaos else 0.0)
    ledger = Ledger(config.data_dir)

    def message_id(message: Message) -> str | None:
        chaos.plan()
        chaos.reached("before_claim")
        return message.message_id

    def write_receipt(ctx: MessageContext) -> None:
        receipt = ctx.payload
        ctx.tx.execute(
            "INSERT INTO rocket_receipts (message_id, ride_id, user_id, charge_id, sent_at)"
            " VALUES (:message_id, :ride_id, :user_id, :charge_id, :sent_at)",
            {
                "message_id": ctx.key,
                "ride_id": int(receipt["ride_id"]),
                "user_id": receipt["user"],
                "charge_id": receipt.get("charge_id"),
                "sent_at": time.time(),
            },
        )
        chaos.reached("in_transaction")

    def settled(message: Message, disposition: Disposition) -> None:
        ledger.write(
            event="settled",
            id=message.message_id,
            copy=message.headers.get(COPY_HEADER),
            outcome=disposition.outcome,
            redelivered=message.redelivered,
        )
        chaos.reached("after_settle")

    consumer = Consumer(
        name=CONSUMER,
        handler=write_receipt,
        transactional=True,
        decode="json",
        message_id=message_id,
        retry_delay=timedelta(milliseconds=200),
    )
    with open_sql_store(config.database) as store:
        worker = PikaConsumer(
            consumer,
            store,
            url=broker.url,
            queue=broker.queue,
            prefetch=broker.prefetch,
            reconnect_delay=0.2,
            on_settled=settled,
        )
        worker.install_signal_handlers()
        worker.run()


def receipts(database: str, ride_ids: set[int]) -> list[Receipt]:
    """The receipts the consumers wrote for ``ride_ids``, oldest first."""
    if not ride_ids:
        return []
    with open_sql_store(database) as store, store.transaction() as tx:
        rows = fetch(
            tx,
            "SELECT message_id, ride_id, user_id, charge_id, sent_at FROM rocket_receipts"
            " WHERE ride_id >= :first ORDER BY id",
            {"first": min(ride_ids)},
        )
    return [
        Receipt(
            row["message_id"], row["ride_id"], row["user_id"], row["charge_id"], 1, row["sent_at"]
        )
        for row in rows
        if row["ride_id"] in ride_ids
    ]
