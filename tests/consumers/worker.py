"""A guarded consumer process for the crash tests, killed at a chosen boundary.

    python -m tests.consumers.worker ADAPTER MODE STORE_URL QUEUE

ADAPTER is ``pika`` or ``aio``; MODE ``transaction`` or ``handler``; STORE_URL a
PostgreSQL URL or a SQLite path. ``IDEM_KILL`` lists ``boundary:id`` pairs; the
process SIGKILLs itself the first time (over all processes: a marker file in
``IDEM_MARKERS`` is created exclusively first) it reaches that boundary for that
message id: ``before_claim`` (while the id is derived), ``in_transaction`` (after the
handler's write, before the commit; in handler mode: after the effect, before the
key is finished) or ``after_commit`` (settled, before the ack). SIGTERM stops it
gracefully.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta
from typing import Any

from idempotence.consumers import Consumer, Disposition, Message, MessageContext

KILLS = {tuple(item.split(":", 1)) for item in os.environ.get("IDEM_KILL", "").split(",") if item}
MARKERS = os.environ.get("IDEM_MARKERS", "")
SLOW = float(os.environ.get("IDEM_SLOW", "0"))


def maybe_die(boundary: str, key: str | None) -> None:
    if key is None or (boundary, key) not in KILLS:
        return
    try:
        fd = os.open(os.path.join(MARKERS, f"{boundary}-{key}"), os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    os.fsync(fd)
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def ready() -> None:
    """Tell the test that SIGTERM now stops this process gracefully."""
    open(os.path.join(MARKERS, f"ready-{os.getpid()}"), "w").close()


def message_id(message: Message) -> str | None:
    maybe_die("before_claim", message.message_id)
    return message.message_id


def on_settled(message: Message, disposition: Disposition) -> None:
    if disposition.outcome == "processed":
        maybe_die("after_commit", disposition.key)


def statements(store_url: str) -> tuple[str, str]:
    mark = "?" if not store_url.startswith("postgres") else "%s"
    effect = f"INSERT INTO effects (message_id, pid) VALUES ({mark}, {mark})"
    derived = f"INSERT INTO derived (derived_key) VALUES ({mark}) ON CONFLICT DO NOTHING"
    return effect, derived


def make_consumer(mode: str, queue: str, store_url: str, sync: bool) -> Consumer:
    effect, derived = statements(store_url)

    def write(ctx: MessageContext, tx: Any) -> Any:
        if SLOW:
            import time

            open(os.path.join(MARKERS, f"started-{ctx.key}"), "w").close()
            time.sleep(SLOW)
        return tx.execute(effect, (ctx.key, os.getpid()))

    if mode == "transaction":

        def handle(ctx: MessageContext) -> Any:
            if sync:
                write(ctx, ctx.tx)
                maybe_die("in_transaction", ctx.key)
                return None
            return _async_in_tx(ctx, write)

    else:
        # Handler mode: the effect is a plain autocommit write (a run killed after it
        # runs again), and the downstream effect is made with the derived key (R4).
        def handle(ctx: MessageContext) -> Any:
            return _handler_effects(ctx, store_url, effect, derived, sync)

    return Consumer(
        name=queue,
        handler=handle,
        transactional=mode == "transaction",
        message_id=message_id,
        lock_timeout=timedelta(seconds=2),
        retry_delay=timedelta(milliseconds=200),
    )


async def _async_in_tx(ctx: MessageContext, write: Any) -> None:
    await write(ctx, ctx.tx)
    maybe_die("in_transaction", ctx.key)


def _handler_effects(
    ctx: MessageContext, store_url: str, effect: str, derived: str, sync: bool
) -> Any:
    run = _connection(store_url)
    try:
        run(effect, (ctx.key, os.getpid()))
        run(derived, (ctx.key_for("effect"),))
    finally:
        run(None, None)
    maybe_die("in_transaction", ctx.key)
    if not sync:
        return asyncio.sleep(0)
    return None


def _connection(store_url: str) -> Any:
    """A plain autocommit connection: ``run(sql, params)``, ``run(None, None)`` closes."""
    if store_url.startswith("postgres"):
        import psycopg

        conn: Any = psycopg.connect(store_url, autocommit=True)
    else:
        import sqlite3

        conn = sqlite3.connect(store_url, isolation_level=None, timeout=30)

    def run(sql: str | None, params: Any) -> None:
        if sql is None:
            conn.close()
        else:
            conn.execute(sql, params)

    return run


def open_store(store_url: str, sync: bool) -> Any:
    if store_url.startswith("postgres"):
        from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore

        return PostgresStore(store_url) if sync else AsyncPostgresStore(store_url)
    from idempotence import AsyncSqliteStore, SqliteStore

    return SqliteStore(store_url) if sync else AsyncSqliteStore(store_url)


def main(adapter: str, mode: str, store_url: str, queue: str, amqp: str) -> None:
    sync = adapter == "pika"
    consumer = make_consumer(mode, queue, store_url, sync)
    if sync:
        from idempotence.consumers.rabbitmq_pika import PikaConsumer

        worker = PikaConsumer(
            consumer, open_store(store_url, True), url=amqp, queue=queue, prefetch=8,
            declare=False, reconnect_delay=0.2, on_settled=on_settled,
        )  # fmt: skip
        worker.install_signal_handlers()
        ready()
        worker.run()
        return

    async def run() -> None:
        from idempotence.consumers.rabbitmq_aio import AioPikaConsumer

        aio = AioPikaConsumer(
            consumer, open_store(store_url, False), url=amqp, queue=queue, prefetch=8,
            declare=False, reconnect_delay=0.2, on_settled=on_settled,
        )  # fmt: skip
        aio.install_signal_handlers()
        ready()
        await aio.run()

    asyncio.run(run())


if __name__ == "__main__":
    main(*sys.argv[1:6])
