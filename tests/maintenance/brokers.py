"""The brokers the sink tests deliver to: what a queue holds, a URL where no broker
is, a Celery app on the test broker, and a guarded consumer of what the sinks sent."""

from __future__ import annotations

import inspect
import socket
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pika
from celery import Celery

from idempotence import maintenance
from idempotence.consumers import Consumer, Message, MessageContext, process
from idempotence.stores import Store
from tests.maintenance.support import Flavour


def drain(url: str, queue: str) -> list[tuple[Any, bytes]]:
    """Every message in ``queue``: (properties, body), acknowledged."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        messages = []
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return messages
            messages.append((properties, body))
    finally:
        connection.close()


def closed_port_url() -> str:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    return f"amqp://guest:guest@127.0.0.1:{port}/%2F"


def celery_app(url: str, confirm: bool = True) -> Celery:
    app = Celery("sink-test", broker=url.replace("/%2F", "//"))
    if confirm:
        app.conf.broker_transport_options = {"confirm_publish": True}
    return app


def consume(store: Store, messages: Sequence[tuple[Any, bytes]]) -> list[str]:
    """Hand ``messages`` (from :func:`drain`) to a consumer guarded by their message
    ids; the keys its handler ran for, each once however often it was sent."""
    handled: list[str] = []

    def handler(ctx: MessageContext) -> None:
        handled.append(ctx.key)

    consumer = Consumer(name=f"receipts-{uuid.uuid4().hex[:6]}", handler=handler)
    for properties, body in messages:
        process(consumer, store, Message(body, message_id=properties.message_id))
    return handled


@contextmanager
def sink_of(flavour: Flavour, cls: type[Any], *args: Any, **kw: Any) -> Iterator[Any]:
    """``cls(*args, **kw)``, a sync sink, or on the async flavour its ``Async`` twin (the
    source it is generated from); closed after, on the flavour's event loop."""
    if flavour.name == "async":
        cls = getattr(maintenance, "Async" + cls.__name__)
    sink = cls(*args, **kw)
    try:
        yield sink
    finally:
        closed = sink.close() if hasattr(sink, "close") else None
        if inspect.isawaitable(closed):
            flavour.db.loop.run(closed)
