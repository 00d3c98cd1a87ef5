"""Message consumers: exactly-once effects for at-least-once deliveries (DESIGN 9).

A delivered message is one more run of the engine (F6): its id is the key, in the
consumer's scope, and the guard (`_guard`, pure) tells the broker adapter what
to do with the delivery: ack it (processed now, or a duplicate absorbed), requeue it
after a delay (its key is in progress elsewhere, M2, or an attempt failed), or
dead-letter it (M3: the ``max_attempts``-th failure, its key errored; or a hostile
message). The adapter acks only after the guard returned, so after the commit (M1).

```python
consumer = Consumer(name="receipts", handler=write_receipt, transactional=True)
process(consumer, store, Message(b'{"ride": 7}', message_id="m-1"))
# Disposition(action=<Action.ACK: 'ack'>, outcome='processed', ...)
```

RabbitMQ adapters:
[`idempotence.consumers.rabbitmq_pika`][idempotence.consumers.rabbitmq_pika] (pika,
sync) and [`idempotence.consumers.rabbitmq_aio`][idempotence.consumers.rabbitmq_aio]
(aio-pika), ``pip install 'idempotence[rabbitmq]'``.
"""

from ._driver import process
from ._driver_async import process_async
from ._guard import (
    CONSUMER_FLOW,
    CONSUMER_RETENTION,
    Action,
    Consumer,
    Disposition,
    HostileMessage,
    Message,
    MessageContext,
    mark_errored,
)

__all__ = [
    "CONSUMER_FLOW",
    "CONSUMER_RETENTION",
    "Action",
    "Consumer",
    "Disposition",
    "HostileMessage",
    "Message",
    "MessageContext",
    "mark_errored",
    "process",
    "process_async",
]
