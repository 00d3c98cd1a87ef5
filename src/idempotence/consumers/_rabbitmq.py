"""What the two RabbitMQ adapters share, without I/O: the queues, and how a delivery
becomes a [`Message`][idempotence.consumers.Message] and a
[`Disposition`][idempotence.consumers.Disposition] becomes a publish. The pika adapter
([`rabbitmq_pika`][idempotence.consumers.rabbitmq_pika]) and the aio-pika one
([`rabbitmq_aio`][idempotence.consumers.rabbitmq_aio]) only put these on the wire.

The topology, for a queue ``orders``:

* ``orders``: the work queue, durable;
* ``orders.delay``: where a requeued delivery waits (M2, or a failed attempt). It has
  no consumer; each message carries its own TTL (``expiration``) and, when it expires,
  RabbitMQ dead-letters it back to ``orders`` through the default exchange. A message
  expires only at the head of the queue, so a long delay can hold shorter ones behind
  it: they come back late, never early;
* ``orders.dead``: the dead-letter queue (M3, hostile messages), with the reason in
  the ``x-idempotence-reason`` header.

Requeue and dead-letter publish a copy (with publisher confirms) and ack the original
only then: a crash in between leaves two copies, and the guard absorbs the second.
The copy is published ``mandatory``: a copy no queue takes (its queue was never
declared, or was deleted) is returned by the broker, and then confirmed as if
delivered. An adapter that took that confirm for a delivery would ack the original
and lose the message; both see the return (`refused`), leave the original unacked
(nacked back to its queue) and pause, so the message waits, with an error in the log,
until its queue exists (a nacked delivery goes back to the head of its queue: with
``prefetch=1`` the messages behind it wait too). The attempt count rides in the
``x-idempotence-attempt`` header.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypedDict, TypeVar

from ._guard import Action, Consumer, Disposition, Message

S = TypeVar("S")

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
"""The shared broker of a development machine, guest/guest, the default vhost."""

ATTEMPT_HEADER = "x-idempotence-attempt"
"""The header that carries the attempt number of a requeued delivery."""
REASON_HEADER = "x-idempotence-reason"
"""The header that says why a message was dead-lettered."""
_MAX_REASON = 1000


@dataclass(frozen=True, slots=True)
class Topology:
    """The queues of one guarded consumer."""

    queue: str

    @property
    def delay_queue(self) -> str:
        return f"{self.queue}.delay"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.queue}.dead"

    def delay_arguments(self) -> dict[str, Any]:
        """The delay queue's arguments: expired messages go back to the work queue."""
        return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": self.queue}


@dataclass(frozen=True, slots=True)
class Forward:
    """A copy to publish (default exchange) before the original is acked."""

    routing_key: str
    headers: dict[str, Any]
    delay_ms: int | None = None
    """Per-message TTL in milliseconds (AMQP ``expiration``), or None."""


def incoming(
    body: bytes,
    message_id: str | None,
    headers: Mapping[str, Any] | None,
    redelivered: bool | None,
) -> Message:
    """A delivery as the guard's [`Message`][idempotence.consumers.Message]."""
    headers = dict(headers or {})
    return Message(
        body=bytes(body),
        message_id=message_id,
        headers=headers,
        attempt=_attempt(headers.get(ATTEMPT_HEADER)),
        redelivered=bool(redelivered),
    )


def _attempt(value: Any) -> int:
    try:
        attempt = int(value)
    except (TypeError, ValueError):
        return 1
    return attempt if attempt >= 1 else 1


def forward(
    topology: Topology, disposition: Disposition, headers: Mapping[str, Any] | None
) -> Forward | None:
    """Where the delivery goes before it is acked, or None: just ack it."""
    if disposition.action is Action.ACK:
        return None  # the common case: no copy, nothing to build
    kept = {k: v for k, v in (headers or {}).items() if k != "x-death"}
    if disposition.action is Action.REQUEUE:
        kept[ATTEMPT_HEADER] = disposition.attempt
        return Forward(topology.delay_queue, kept, max(1, round(disposition.delay * 1000)))
    if disposition.action is Action.DEAD_LETTER:
        kept[REASON_HEADER] = disposition.reason[:_MAX_REASON]
        return Forward(topology.dead_letter_queue, kept)
    return None


def refused(name: str, copy: Forward, reply: str) -> str:
    """The error logged when the broker did not take ``copy`` (returned as unroutable,
    or nacked; ``reply`` is its word): the original is not acked but goes back to its
    queue (M1), so nothing is lost, and it comes back until the copy's queue exists."""
    return (
        f"consumer {name!r}: the broker refused the copy for queue {copy.routing_key!r} "
        f"({reply}), so the message was not acked: it goes back to its queue and is "
        "handled again. Declare that queue (or run the consumer with declare=True)"
    )


KEPT_PROPERTIES = (
    "content_type",
    "content_encoding",
    "message_id",
    "correlation_id",
    "type",
    "app_id",
    "timestamp",
    "priority",
)
"""The properties a forwarded copy keeps (pika's and aio-pika's names agree)."""


class Acks:
    """The deliveries settled (committed, forwarded) but not acked yet, acked together
    with one ``basic.ack`` (``multiple=True``): an ack frame per few messages instead of
    one per message, on the client, the wire and the broker.

    M1 holds: a delivery is recorded only once the guard settled it, and an ack with
    ``multiple`` covers the channel's deliveries up to the tag, which one consumer
    settles in order (a nacked one is no longer outstanding). The acks go out before
    the adapter could wait for the broker (no delivery waiting in the client's buffer),
    before a nack, before the consumer is cancelled, once half the prefetch is pending,
    so the broker keeps delivering, and at once after a forwarded copy (requeue,
    dead letter), so a crash leaves two copies of that one message at most, as before.
    A connection lost before the acks go out redelivers those messages, and the guard
    absorbs them (duplicates), as it absorbs the one a consumer dies holding. Delivery
    tags are the channel's: one per session.

    ```python
    acks = Acks(prefetch=4)
    acks.settled(1); acks.due(waiting=3)
    # False
    acks.settled(2); acks.due(waiting=3), acks.take()
    # (True, 2)
    acks.take() is None
    # True
    ```
    """

    __slots__ = ("_count", "_last", "_limit")

    def __init__(self, prefetch: int) -> None:
        self._limit = max(1, prefetch // 2)
        self._last: int | None = None
        self._count = 0

    def settled(self, tag: int) -> None:
        """Delivery ``tag`` is settled: it may be acked."""
        self._last, self._count = tag, self._count + 1

    def due(self, waiting: int) -> bool:
        """Ack now? ``waiting``: the deliveries the client holds, not handled yet."""
        return self._count >= self._limit or (self._count > 0 and waiting == 0)

    def take(self) -> int | None:
        """The tag to ack with ``multiple=True`` (None: nothing pending); forgets it."""
        tag, self._last, self._count = self._last, None, 0
        return tag


def connection_name(queue: str, name: str | None) -> str:
    """The name the adapter's connection shows in ``rabbitmqctl list_connections``."""
    return name or f"idempotence-consumer:{queue}"


def described(disposition: Disposition) -> str:
    """A log line's account of what became of a delivery."""
    text = f"{disposition.outcome} (key {disposition.key!r})"
    if disposition.action is Action.REQUEUE:
        text += f", back in {disposition.delay:.1f}s as attempt {disposition.attempt}"
    if disposition.reason:
        text += f": {disposition.reason}"
    return text


class Options(TypedDict, total=False):
    """The adapters' keyword arguments (see `Settings`)."""

    url: str
    queue: str | None
    prefetch: int
    declare: bool
    reconnect_delay: float
    name: str | None
    on_settled: Callable[[Message, Disposition], None] | None


class Settings(Generic[S]):
    """What both adapters are given; see
    [`PikaConsumer`][idempotence.consumers.rabbitmq_pika.PikaConsumer].

    ``queue`` defaults to the consumer's name; ``prefetch`` is the broker's
    ``basic.qos``; ``declare`` declares the three queues (durable); ``name`` is the
    connection's name on the broker; ``on_settled(message, disposition)`` is called
    after the guard settled a delivery (committed, for a processed one) and before
    the ack."""

    def __init__(
        self,
        consumer: Consumer,
        store: S,
        *,
        url: str = DEFAULT_URL,
        queue: str | None = None,
        prefetch: int = 16,
        declare: bool = True,
        reconnect_delay: float = 1.0,
        name: str | None = None,
        on_settled: Callable[[Message, Disposition], None] | None = None,
    ) -> None:
        consumer.check_store(store)
        self.consumer, self.store, self.url = consumer, store, url
        self.topology = Topology(queue or consumer.name)
        self.prefetch, self.declare = prefetch, declare
        self.reconnect_delay = reconnect_delay
        self.name = connection_name(self.topology.queue, name)
        self.on_settled = on_settled
