"""The AMQP connection the RabbitMQ sinks publish through, in both spellings: pika for
[`RabbitMQSink`][idempotence.maintenance.RabbitMQSink], aio-pika for
[`AsyncRabbitMQSink`][idempotence.maintenance.AsyncRabbitMQSink]. Their APIs differ by
more than a keyword, so, as in `_concurrency`, both are written here side by side and
the sink itself is written once (`sinks_async`, and the `sinks` generated from it).

Each keeps one connection with one channel in publisher-confirm mode, opened at the
first call and again after ``close`` (the sink closes it when a publish failed, so a
broker that restarted is reconnected to). ``publish_all`` returns only once the broker
confirmed every message; a refusal (nack) or a message the broker could not route
(mandatory) raises one of ``errors``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from ._sinks_shared import Outgoing

__all__ = ["AsyncPublisher", "Publisher"]

logger = logging.getLogger("idempotence.maintenance.sinks")


class AsyncPublisher:
    """One aio-pika connection in confirm mode (the rabbitmq extra)."""

    def __init__(self, url: str, timeout: float) -> None:
        import aio_pika
        import aio_pika.exceptions

        self._aio_pika = aio_pika
        self._url = url
        self._timeout = timeout
        self._connection: Any = None
        self._channel: Any = None
        self._declared: set[str] = set()
        self.errors: tuple[type[BaseException], ...] = (
            *aio_pika.exceptions.CONNECTION_EXCEPTIONS,  # AMQP errors, OSError and the like
            aio_pika.exceptions.ChannelInvalidStateError,
            TimeoutError,  # no connection or no confirm in time
        )
        """What a publish that the broker did not confirm raises."""

    async def _open(self) -> Any:
        if self._channel is None or self._channel.is_closed:
            await self.close()
            self._connection = await self._aio_pika.connect(self._url, timeout=self._timeout)
            # on_return_raises: a message the broker cannot route fails its publish
            # (aio-pika's default hands it to a callback and confirms the publish).
            self._channel = await self._connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
            self._declared.clear()
        return self._channel

    async def declare(self, queue: str) -> None:
        """Declare ``queue`` durable, once per connection."""
        channel = await self._open()
        if queue not in self._declared:
            await channel.declare_queue(queue, durable=True, timeout=self._timeout)
            self._declared.add(queue)

    async def publish_all(self, exchange: str, messages: Sequence[Outgoing]) -> None:
        """Publish ``messages`` in order and wait until the broker confirmed every one.

        They are sent without waiting for each confirm in turn: the broker writes
        persistent messages to disk in groups and confirms each group at once, so a
        batch costs about one disk write, not one per message (measured: several times
        the jobs per second of one publish at a time)."""
        await self._open()
        sent = await asyncio.gather(
            *(self._publish(exchange, message) for message in messages), return_exceptions=True
        )
        for outcome in sent:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _publish(self, exchange: str, message: Outgoing) -> None:
        aio_pika = self._aio_pika
        channel = await self._open()
        target = (
            channel.default_exchange
            if exchange == ""
            else await channel.get_exchange(exchange, ensure=False)
        )
        await target.publish(
            aio_pika.Message(
                message.body,
                message_id=message.message_id,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                content_type="application/json",
                type=message.type,
                headers=dict(message.headers),
            ),
            message.route,
            mandatory=True,
            timeout=self._timeout,
        )

    async def close(self) -> None:
        """Close the connection (the next call opens another)."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and not connection.is_closed:
            try:
                await connection.close()
            except Exception as exc:  # it is going away: nothing more to lose
                logger.debug("closing the sink's connection failed: %r", exc)


class Publisher:
    """One pika connection in confirm mode (the rabbitmq extra)."""

    def __init__(self, url: str, timeout: float) -> None:
        import pika
        import pika.exceptions

        self._pika = pika
        self._parameters = pika.URLParameters(url)
        self._parameters.socket_timeout = timeout
        self._parameters.blocked_connection_timeout = timeout
        self._parameters.connection_attempts = 1
        self._connection: Any = None
        self._channel: Any = None
        self._declared: set[str] = set()
        self.errors: tuple[type[BaseException], ...] = (pika.exceptions.AMQPError, OSError)
        """What a publish that the broker did not confirm raises."""

    def _open(self) -> Any:
        if self._channel is None or not self._channel.is_open:
            self.close()
            self._connection = self._pika.BlockingConnection(self._parameters)
            self._channel = self._connection.channel()
            self._channel.confirm_delivery()
            self._declared.clear()
        return self._channel

    def declare(self, queue: str) -> None:
        """Declare ``queue`` durable, once per connection."""
        channel = self._open()
        if queue not in self._declared:
            channel.queue_declare(queue, durable=True)
            self._declared.add(queue)

    def publish_all(self, exchange: str, messages: Sequence[Outgoing]) -> None:
        """Publish ``messages`` in order, each once the broker confirmed the one before
        (pika's blocking connection waits for each confirm in turn)."""
        pika = self._pika
        channel = self._open()
        for message in messages:
            properties = pika.BasicProperties(
                message_id=message.message_id,
                delivery_mode=pika.DeliveryMode.Persistent,
                content_type="application/json",
                type=message.type,
                headers=dict(message.headers),
            )
            # In confirm mode this returns once the broker confirmed the message, and
            # raises if it refused it (nack) or could not route it (mandatory).
            channel.basic_publish(exchange, message.route, message.body, properties, mandatory=True)

    def close(self) -> None:
        """Close the connection (the next call opens another)."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except Exception as exc:  # it is going away: nothing more to lose
                logger.debug("closing the sink's connection failed: %r", exc)
