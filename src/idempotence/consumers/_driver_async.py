"""Drive a delivery through the guard (`_guard`) to its disposition.

[`process_async`][idempotence.consumers.rabbitmq_aio.process_async] is the source;
[`process`][idempotence.consumers.rabbitmq_pika.process] is generated from it (F7).
Every effect is the engine's and is performed by the flows driver (`perform_async`): the
claim, the handler with its heartbeats (F2) or inside the claim's transaction (F3), the
settling and the errored mark. Only running the consumer's handler is the consumer's
own.
"""

from __future__ import annotations

from typing import Any

from .._awaitables import settle_async
from ..flows._driver_async import drive_async
from ..flows.effects import DoHandle
from ..flows.results import Captured
from ..stores import AsyncKeyStore
from ._guard import PROCESSED, Consumer, Disposition, Message, MessageContext, lifecycle

_NOT_SYNC = "a consumer handler run by a sync consumer must not be async"
_DONE = Captured(PROCESSED.status, PROCESSED.headers, PROCESSED.body)
"""What the handler answers the engine: the acknowledgement every processed key stores."""


class _AsyncHandlerApp:
    """Runs the consumer's handler for the engine, with the lease and the transaction
    (transactional mode) it is given."""

    __slots__ = ("consumer", "key", "message", "payload")

    def __init__(self, consumer: Consumer, message: Message, key: str, payload: Any) -> None:
        self.consumer, self.message, self.key, self.payload = consumer, message, key, payload

    async def run_app(self, run: DoHandle, tx: Any, overflow: Any) -> Captured:
        consumer = self.consumer
        assert consumer.handler is not None
        context = MessageContext(
            self.message, self.payload, self.key, consumer.key_scope, run.lease, tx, consumer.name
        )
        await settle_async(consumer.handler(context), _NOT_SYNC)
        return _DONE


async def process_async(consumer: Consumer, store: AsyncKeyStore, message: Message) -> Disposition:
    """Run ``message`` through ``consumer``'s guard on ``store``; return what the
    adapter must do with it (ack only after this returns: M1).

    Handler mode needs only a key store; transactional and flow consumers need a SQL
    store ([`AsyncStore`][idempotence.testing.harness.AsyncStore])."""

    consumer.check_store(store)

    def make_app(key: str, payload: Any) -> _AsyncHandlerApp:
        return _AsyncHandlerApp(consumer, message, key, payload)

    disposition = await drive_async(lifecycle(consumer, message, make_app), store)
    instrumentation = getattr(store, "instrumentation", None)
    if instrumentation is not None:
        instrumentation.message(consumer.name, disposition.outcome)
    return disposition
