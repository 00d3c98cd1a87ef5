"""The guard on RabbitMQ with pika (sync): ``pip install 'idempotence[rabbitmq]'``.

A thin adapter: it turns each delivery into a
[`Message`][idempotence.consumers.Message], asks the guard
([`process`][idempotence.consumers.rabbitmq_pika.process]) what to do, forwards the copy
the guard's answer needs (delay or dead-letter queue, see
`idempotence.consumers._rabbitmq`), and acks only then (M1), several settled deliveries
in one ack (``multiple``, see `Acks`). It declares the queues, sets the prefetch,
reconnects when the connection is lost (unacked deliveries come back and the guard
absorbs what was done), and stops gracefully: `stop` (SIGTERM, with
[`PikaConsumer.install_signal_handlers`][idempotence.consumers.rabbitmq_pika.PikaConsumer.install_signal_handlers])
lets the current message finish, cancels the consumer (prefetched deliveries go back to
the queue) and returns.

```python
worker = PikaConsumer(Consumer(name="receipts", handler=write, transactional=True),
                      store, url="amqp://guest:guest@127.0.0.1:5672/%2F",
                      queue="receipts")
worker.install_signal_handlers(); worker.run()
```
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any, Unpack

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from ..stores import KeyStore
from ._driver import process
from ._guard import Consumer
from ._rabbitmq import (
    DEFAULT_URL,
    KEPT_PROPERTIES,
    Acks,
    Forward,
    Options,
    Settings,
    described,
    forward,
    incoming,
    refused,
)

logger = logging.getLogger("idempotence.consumers")

__all__ = ["DEFAULT_URL", "PikaConsumer"]

_LOST = (pika.exceptions.AMQPError, ConnectionError, OSError)


class PikaConsumer(Settings[KeyStore]):
    """Consume ``queue`` (default: the consumer's name) through ``consumer``'s guard
    on ``store``. ``on_settled(message, disposition)`` is called after the guard
    settled a delivery (committed, for a processed one) and before it is acked."""

    def __init__(self, consumer: Consumer, store: KeyStore, **options: Unpack[Options]) -> None:
        super().__init__(consumer, store, **options)
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Finish the current message, stop consuming, and make
        [`run`][idempotence.consumers.rabbitmq_pika.PikaConsumer.run] return."""
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        """Stop gracefully on SIGTERM and SIGINT (call it from the main thread)."""
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda *_: self.stop())

    def run(self) -> None:
        """Consume until
        [`stop`][idempotence.consumers.rabbitmq_pika.PikaConsumer.stop], reconnecting
        whenever the connection is lost."""
        while not self._stopping.is_set():
            try:
                self._session()
            except _LOST as exc:
                logger.warning("consumer %r: connection lost, reconnecting: %r", self.name, exc)
                self._stopping.wait(self.reconnect_delay)

    def _session(self) -> None:
        parameters = pika.URLParameters(self.url)
        parameters.client_properties = {"connection_name": self.name}
        connection = pika.BlockingConnection(parameters)
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_qos(prefetch_count=self.prefetch)
            if self.declare:
                self._declare(channel)
            logger.info("consumer %r: consuming %r", self.name, self.topology.queue)
            acks = Acks(self.prefetch)  # delivery tags are the channel's
            for method, properties, body in channel.consume(
                self.topology.queue, inactivity_timeout=0.25
            ):
                if method is not None:
                    self._handle(channel, acks, method, properties, body)
                if acks.due(channel.get_waiting_message_count()):
                    _ack(channel, acks)
                if self._stopping.is_set():
                    break
            _ack(channel, acks)
            channel.cancel()  # prefetched, unacked deliveries go back to the queue
        finally:
            if connection.is_open:
                connection.close()

    def _declare(self, channel: BlockingChannel) -> None:
        topology = self.topology
        channel.queue_declare(topology.queue, durable=True)
        channel.queue_declare(
            topology.delay_queue, durable=True, arguments=topology.delay_arguments()
        )
        channel.queue_declare(topology.dead_letter_queue, durable=True)

    def _handle(
        self, channel: BlockingChannel, acks: Acks, method: Any, properties: Any, body: bytes
    ) -> None:
        message = incoming(body, properties.message_id, properties.headers, method.redelivered)
        try:
            disposition = process(self.consumer, self.store, message)
        except Exception as exc:
            # The guard itself failed (not the handler, which it answers): nothing was
            # acked; the delivery goes back to the queue.
            logger.error("consumer %r: the guard failed: %r", self.name, exc, exc_info=exc)
            self._put_back(channel, acks, method.delivery_tag)
            return
        if self.on_settled is not None:
            self.on_settled(message, disposition)
        copy = forward(self.topology, disposition, properties.headers)
        if copy is not None:
            try:
                _publish(channel, properties, body, copy)
            except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as exc:
                # Returned (no queue took it) or nacked: the copy is not in its queue,
                # so the original must not be acked. Not a lost connection: the channel
                # is fine, and reconnecting would only hide the cause.
                logger.error(refused(self.name, copy, _reply(exc)))
                self._put_back(channel, acks, method.delivery_tag)
                return
        acks.settled(method.delivery_tag)  # acked soon, with others (M1: after the commit)
        if copy is not None:
            # A copy went out: ack its original at once, as before, so a crash cannot
            # leave two copies of more than this one (requeued, dead-lettered).
            _ack(channel, acks)
        if logger.isEnabledFor(logging.DEBUG):  # build the account only for a reader
            logger.debug("consumer %r: %s", self.name, described(disposition))

    def _put_back(self, channel: BlockingChannel, acks: Acks, tag: int) -> None:
        """Send delivery ``tag`` back to its queue, unacked (those settled before it
        are acked first), and pause before the next."""
        _ack(channel, acks)
        channel.basic_nack(tag, requeue=True)
        self._stopping.wait(self.reconnect_delay)


def _publish(channel: BlockingChannel, properties: Any, body: bytes, copy: Forward) -> None:
    """Publish ``copy`` (mandatory, confirmed): raises UnroutableError when the broker
    returns it, NackError when it nacks it."""
    kept = {name: getattr(properties, name) for name in KEPT_PROPERTIES}
    props = pika.BasicProperties(
        headers=copy.headers,
        delivery_mode=pika.DeliveryMode.Persistent,
        expiration=None if copy.delay_ms is None else str(copy.delay_ms),
        **kept,
    )
    channel.basic_publish("", copy.routing_key, body, props, mandatory=True)


def _reply(exc: pika.exceptions.UnroutableError | pika.exceptions.NackError) -> str:
    """The broker's word on a copy it refused: a return's reply text, or a nack."""
    if isinstance(exc, pika.exceptions.UnroutableError) and exc.messages:
        return f"returned: {exc.messages[0].method.reply_text}"
    return "nacked"


def _ack(channel: BlockingChannel, acks: Acks) -> None:
    """Ack the settled deliveries not acked yet, in one frame."""
    tag = acks.take()
    if tag is not None:
        channel.basic_ack(tag, multiple=True)
