"""Guarded consumers running in the test process, on a thread: the pika adapter, or the
aio-pika one on an event loop of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from idempotence import AsyncSqliteStore, SqliteStore
from idempotence.consumers import Consumer, Disposition, Message
from idempotence.consumers.rabbitmq_aio import AioPikaConsumer
from idempotence.consumers.rabbitmq_pika import PikaConsumer
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore

Settled = list[tuple[Message, Disposition]]


def sync_store(url: str) -> Any:
    return PostgresStore(url) if url.startswith("postgres") else SqliteStore(url)


def async_store(url: str) -> Any:
    return AsyncPostgresStore(url) if url.startswith("postgres") else AsyncSqliteStore(url)


@contextmanager
def running(
    adapter: str,
    consumer: Consumer,
    store_url: str,
    amqp: str,
    queue: str,
    settled: Settled,
    hook: Callable[[Message, Disposition], None] | None = None,
    **options: Any,
) -> Iterator[threading.Thread]:
    """Run ``consumer`` on ``queue`` until the block ends; every settled delivery is
    appended to ``settled`` (``hook`` runs first, before the ack)."""

    def on_settled(message: Message, disposition: Disposition) -> None:
        if hook is not None:
            hook(message, disposition)
        settled.append((message, disposition))

    options = {"url": amqp, "queue": queue, "on_settled": on_settled, **options}
    if adapter == "pika":
        store = sync_store(store_url)
        worker = PikaConsumer(consumer, store, **options)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            yield thread
        finally:
            worker.stop()
            thread.join(60)
            store.close()
        assert not thread.is_alive(), "the pika consumer did not stop"
        return
    holder: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> None:
        store = async_store(store_url)
        holder["loop"] = asyncio.get_running_loop()
        holder["worker"] = AioPikaConsumer(consumer, store, **options)
        started.set()
        try:
            await holder["worker"].run()
        finally:
            await store.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    started.wait(30)
    try:
        yield thread
    finally:
        holder["loop"].call_soon_threadsafe(holder["worker"].stop)
        thread.join(60)
    assert not thread.is_alive(), "the aio-pika consumer did not stop"
