"""A guarded RabbitMQ consumer run inside an app host's namespace
(test_consumer_partitions.py).

    python -m tests.network.consumer MODE STORE_URL AMQP_URL QUEUE LEDGER

MODE is ``handler`` or ``transaction``; STORE_URL the PostgreSQL key store, reached
over the back link (the link the test cuts); AMQP_URL the broker, over the front link
(never cut); LEDGER a SQLite file on this machine's disk (shared, not networked), where
the process writes what happened:

* ``runs``: one row per run of the handler (handler mode), its effect: a charge keyed
  by the key derived from the message's (R4), with ``IDEM_WORK`` seconds of work after it;
* ``begun``: each delivery as it reaches the guard (message id, when);
* ``deliveries``: each delivery as the adapter settled it (message id, action, outcome,
  and when it began and ended, on the machine's monotonic clock, which the test shares).

In transaction mode the handler's effect is a row of ``net_transfers``, written in the
claim's transaction. The lock timeout is ``IDEM_LOCK`` seconds, the store's bound 1 s.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import time
from datetime import timedelta
from typing import Any

from idempotence.consumers import Consumer, Disposition, Message, MessageContext
from idempotence.consumers.rabbitmq_aio import AioPikaConsumer
from idempotence.stores.postgres import AsyncPostgresStore

WORK = float(os.environ.get("IDEM_WORK", "0"))
LOCK = float(os.environ.get("IDEM_LOCK", "6"))
BOUND = 1.0


class Ledger:
    def __init__(self, path: str) -> None:
        self.path = path
        self.begun: dict[str, float] = {}
        with self.db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL, charge TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS begun (key TEXT, at REAL)")
            db.execute(
                "CREATE TABLE IF NOT EXISTS deliveries (key TEXT, action TEXT, "
                "outcome TEXT, started REAL, ended REAL)"
            )

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10, isolation_level=None)

    def message_id(self, message: Message) -> str | None:
        if message.message_id is not None:
            now = self.begun[message.message_id] = time.monotonic()
            with self.db() as db:
                db.execute("INSERT INTO begun VALUES (?, ?)", (message.message_id, now))
        return message.message_id

    def settled(self, message: Message, disposition: Disposition) -> None:
        key = message.message_id or ""
        with self.db() as db:
            db.execute(
                "INSERT INTO deliveries VALUES (?, ?, ?, ?, ?)",
                (
                    key,
                    disposition.action.value,
                    disposition.outcome,
                    self.begun.pop(key, time.monotonic()),
                    time.monotonic(),
                ),
            )

    def run(self, ctx: MessageContext) -> None:
        with self.db() as db:
            db.execute("INSERT INTO runs VALUES (?, ?)", (ctx.key, ctx.key_for("charge")))


def make_consumer(mode: str, queue: str, ledger: Ledger) -> Consumer:
    if mode == "transaction":

        async def handle(ctx: MessageContext) -> None:
            await ctx.tx.execute(
                "INSERT INTO net_transfers (key, id) VALUES (%s, %s)", (ctx.key, ctx.lease.id)
            )
            await asyncio.sleep(WORK)  # inside the transaction

    else:

        async def handle(ctx: MessageContext) -> None:
            await asyncio.to_thread(ledger.run, ctx)
            await asyncio.sleep(WORK)

    return Consumer(
        name=queue,
        handler=handle,
        transactional=mode == "transaction",
        message_id=ledger.message_id,
        lock_timeout=timedelta(seconds=LOCK),
        retry_delay=timedelta(milliseconds=300),
    )


async def main(mode: str, store_url: str, amqp: str, queue: str, path: str) -> None:
    ledger = Ledger(path)
    store = AsyncPostgresStore(store_url, statement_timeout=BOUND, connect_timeout=BOUND)
    worker = AioPikaConsumer(
        make_consumer(mode, queue, ledger), store, url=amqp, queue=queue, prefetch=4,
        declare=False, reconnect_delay=0.2, on_settled=ledger.settled,
    )  # fmt: skip
    worker.install_signal_handlers()
    print("ready", flush=True)
    try:
        await worker.run()
    finally:
        await store.close()


def _main(argv: list[str]) -> Any:
    return asyncio.run(main(*argv[1:6]))


if __name__ == "__main__":
    _main(sys.argv)
