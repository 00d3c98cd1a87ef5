"""The guard on RabbitMQ with aio-pika (async): ``pip install 'idempotence[rabbitmq]'``.

The async twin of [`rabbitmq_pika`][idempotence.consumers.rabbitmq_pika], as thin: each
delivery goes through the guard
([`process_async`][idempotence.consumers.rabbitmq_aio.process_async]), the copy its
answer needs is published (with publisher confirms) to the delay or dead-letter queue
(`_rabbitmq`), and the delivery is acked only then (M1). Deliveries are handled one at a
time, in order; ``prefetch`` only keeps the next ones close. It reconnects when the
connection is lost;
[`AioPikaConsumer.stop`][idempotence.consumers.rabbitmq_aio.AioPikaConsumer.stop]
(SIGTERM, with
[`install_signal_handlers`][idempotence.consumers.rabbitmq_aio.AioPikaConsumer.install_signal_handlers])
lets the current message finish, cancels the consumer and returns.

```python
worker = AioPikaConsumer(Consumer(name="receipts", handler=write, transactional=True),
                         store, queue="receipts")
worker.install_signal_handlers(); await worker.run()
```
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any, Unpack

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from ..stores import AsyncKeyStore
from ._driver_async import process_async
from ._guard import Consumer
from ._rabbitmq import (
    DEFAULT_URL,
    KEPT_PROPERTIES,
    Forward,
    Options,
    Settings,
    described,
    forward,
    incoming,
    refused,
)

logger = logging.getLogger("idempotence.consumers")

__all__ = ["DEFAULT_URL", "AioPikaConsumer"]

_LOST = (
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,
    ConnectionError,
    OSError,
)
"""What a lost connection raises, from the connect to the ack."""


class AioPikaConsumer(Settings[AsyncKeyStore]):
    """Consume ``queue`` (default: the consumer's name) through ``consumer``'s guard on
    ``store``; see [`PikaConsumer`][idempotence.consumers.rabbitmq_pika.PikaConsumer]
    for the arguments."""

    def __init__(
        self, consumer: Consumer, store: AsyncKeyStore, **options: Unpack[Options]
    ) -> None:
        super().__init__(consumer, store, **options)
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Finish the current message, stop consuming, and make
        [`run`][idempotence.consumers.rabbitmq_aio.AioPikaConsumer.run] return (call it
        on the consumer's event loop)."""
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        """Stop gracefully on SIGTERM and SIGINT (on the running loop)."""
        loop = asyncio.get_running_loop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, self.stop)

    async def run(self) -> None:
        """Consume until
        [`stop`][idempotence.consumers.rabbitmq_aio.AioPikaConsumer.stop], reconnecting
        whenever the connection is lost."""
        while not self._stopping.is_set():
            try:
                await self._session()
            except _LOST as exc:
                logger.warning("consumer %r: connection lost, reconnecting: %r", self.name, exc)
            if not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.reconnect_delay)

    async def _session(self) -> None:
        connection = await aio_pika.connect(
            self.url, client_properties={"connection_name": self.name}
        )
        async with connection:
            # A returned copy raises (on_return_raises): by default aio-pika would
            # resolve its publish once the broker confirms it, and the original would
            # be acked while the copy went nowhere.
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await channel.set_qos(prefetch_count=self.prefetch)
            queue = await self._queue(channel)
            logger.info("consumer %r: consuming %r", self.name, self.topology.queue)
            async with queue.iterator() as deliveries:
                closer = asyncio.create_task(self._close_on_stop(deliveries))
                try:
                    async for delivery in deliveries:
                        await self._handle(channel, delivery)
                        if self._stopping.is_set():
                            break
                finally:
                    if self._stopping.is_set():
                        await asyncio.gather(closer, return_exceptions=True)  # let it cancel
                    else:
                        closer.cancel()

    async def _close_on_stop(self, deliveries: Any) -> None:
        # Cancels the consumer while a message may be running: it finishes, is acked,
        # and the loop ends; prefetched deliveries go back to the queue.
        await self._stopping.wait()
        await deliveries.close()

    async def _queue(self, channel: AbstractChannel) -> AbstractQueue:
        topology = self.topology
        if not self.declare:
            return await channel.get_queue(topology.queue, ensure=True)
        await channel.declare_queue(
            topology.delay_queue, durable=True, arguments=topology.delay_arguments()
        )
        await channel.declare_queue(topology.dead_letter_queue, durable=True)
        return await channel.declare_queue(topology.queue, durable=True)

    async def _handle(self, channel: AbstractChannel, delivery: AbstractIncomingMessage) -> None:
        headers = dict(delivery.headers or {})
        message = incoming(delivery.body, delivery.message_id, headers, delivery.redelivered)
        try:
            disposition = await process_async(self.consumer, self.store, message)
        except Exception as exc:
            # The guard itself failed (not the handler, which it answers): nothing was
            # acked; the delivery goes back to the queue.
            logger.error("consumer %r: the guard failed: %r", self.name, exc, exc_info=exc)
            await self._put_back(delivery)
            return
        if self.on_settled is not None:
            self.on_settled(message, disposition)
        copy = forward(self.topology, disposition, headers)
        if copy is not None:
            try:
                await self._publish(channel, delivery, copy)
            except aiormq.exceptions.DeliveryError as exc:
                # Returned (no queue took it: the channel raises on returns) or nacked:
                # the copy is not in its queue, so the original must not be acked.
                logger.error(refused(self.name, copy, _reply(exc)))
                await self._put_back(delivery)
                return
        await delivery.ack()
        if logger.isEnabledFor(logging.DEBUG):  # build the account only for a reader
            logger.debug("consumer %r: %s", self.name, described(disposition))

    async def _publish(
        self, channel: AbstractChannel, delivery: AbstractIncomingMessage, copy: Forward
    ) -> None:
        kept = {name: getattr(delivery, name) for name in KEPT_PROPERTIES}
        expiration = None if copy.delay_ms is None else copy.delay_ms / 1000
        out = aio_pika.Message(
            delivery.body,
            headers=copy.headers,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            expiration=expiration,
            **kept,
        )
        await channel.default_exchange.publish(out, copy.routing_key, mandatory=True)

    async def _put_back(self, delivery: AbstractIncomingMessage) -> None:
        """Send the delivery back to its queue, unacked, and pause before the next."""
        await delivery.nack(requeue=True)
        await asyncio.sleep(self.reconnect_delay)


def _reply(exc: aiormq.exceptions.DeliveryError) -> str:
    """The broker's word on a copy it refused: a return's reply text, or a nack."""
    text = getattr(exc.frame, "reply_text", None)  # a Basic.Return's; a Basic.Nack has none
    return f"returned: {text}" if text else "nacked"
