"""Messages per second through RabbitMQ: guarded, unguarded, and the floor (DESIGN 9, 11).

Run it from the repository root::

    .venv/bin/python benchmarks/consumers.py             # 3,000 messages per run
    .venv/bin/python benchmarks/consumers.py --quick     # 500 messages per run
    .venv/bin/python benchmarks/consumers.py --messages 10000 --json

It needs RabbitMQ (``--amqp``, default ``amqp://guest:guest@127.0.0.1:5672/%2F``) and,
for the PostgreSQL rows, PostgreSQL (``--postgres``, default
``$IDEMPOTENCE_TEST_POSTGRES``, else ``postgresql://postgres@127.0.0.1:5432/postgres``;
the script creates ``idempotence_bench_consumers_<pid>`` and drops it at the end).

For each store (PostgreSQL, SQLite), the same handler writes one row per message:

* **unguarded**: a plain pika consumer (prefetch 16) that writes the row in a
  transaction of the store and acks;
* **guarded**: :class:`~idempotence.consumers.rabbitmq_pika.PikaConsumer` with a
  transactional :class:`~idempotence.consumers.Consumer` (prefetch 16): the claim, the
  row and the processed mark commit in one transaction, then the ack;
* **floor**: the unguarded consumer sending, by hand on a connection of its own, the
  statements the guarded one sends (no library code): PostgreSQL, BEGIN and the
  ``claim_finished`` statement (with the store's lock-wait bound) in one pipeline,
  the row, COMMIT; SQLite, ``BEGIN IMMEDIATE``, ``claim_insert_finished``, the row,
  ``COMMIT``. ``floor`` / unguarded is what any guard that writes its key in the
  message's transaction can reach with these statements and drivers, and guarded /
  floor is the library's own overhead.

Every variant gets the same broker settings (prefetch 16, manual ack after the
commit, one message at a time) and the same handler; unguarded and guarded use the
same store (its pool, its transaction), the floor a connection of its own. The
messages are published first, then consumed by one consumer; the rate is messages
settled (committed, about to be acked) per second, from the first to the last: the
connection set-up and the queue declarations of the guarded consumer are not
counted. A guarded or floor run fails unless each of its messages was processed
(the guard's disposition, the floor's claim). ``cpu_ms`` is the client's CPU per message over the
same window (the process's CPU time: it includes pika's and psycopg's work, not the
database server's), which a busy machine disturbs less than the rate. Each variant
runs ``--rounds`` times (default 6: each variant goes first twice), in a round order
that turns every round. It
prints the best rates and, per store, the ratios to unguarded (target for guarded:
>= 0.7): the median of the rounds' paired ratios, the figure to judge, and the ratio
of the best runs. It measures; it does not judge.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import _harness as harness
import pika
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from idempotence import SqliteStore, _queries
from idempotence.consumers import Consumer, Disposition, Message, MessageContext
from idempotence.consumers._guard import PROCESSED
from idempotence.consumers.rabbitmq_pika import PikaConsumer
from idempotence.stores._sql.ops import Query
from idempotence.stores.postgres import PostgresStore
from idempotence.stores.postgres._store_shared import SESSION_PLANNING, bounded_claim

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"
PREFETCH = 16


def publish(amqp: str, queue: str, count: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(amqp))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.queue_declare(f"{queue}.delay", durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue})  # fmt: skip
    channel.queue_declare(f"{queue}.dead", durable=True)
    channel.confirm_delivery()
    for i in range(count):
        properties = pika.BasicProperties(message_id=f"m-{i}", delivery_mode=2)
        channel.basic_publish("", queue, b'{"n": 1}', properties)
    connection.close()


def delete(amqp: str, queue: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(amqp))
    channel = connection.channel()
    for name in (queue, f"{queue}.delay", f"{queue}.dead"):
        channel.queue_delete(name)
    connection.close()


class Window:
    """The measured stretch: from the first message settled to the last, on the clock
    and in the process's CPU time."""

    def __init__(self, count: int) -> None:
        self.count, self.settled, self.processed = count, 0, 0
        self.started = self.cpu = 0.0
        self.elapsed = self.cpu_elapsed = 0.0

    def settle(self, processed: bool = True) -> bool:
        """One more message settled (``processed``: its row written); True at the last."""
        self.settled += 1
        self.processed += processed
        if self.settled == 1:
            self.started, self.cpu = time.perf_counter(), time.process_time()
        elif self.settled == self.count:
            self.elapsed = time.perf_counter() - self.started
            self.cpu_elapsed = time.process_time() - self.cpu
        return self.settled == self.count

    def result(self) -> tuple[float, float]:
        """Messages per second, and client CPU milliseconds per message."""
        if self.processed != self.count:  # every message is new: each writes its row
            raise RuntimeError(f"{self.processed} of {self.count} messages were processed")
        done = self.count - 1
        return done / self.elapsed, 1000 * self.cpu_elapsed / done


def plain(amqp: str, queue: str, count: int, handle: Callable[[str, bytes], bool]) -> Window:
    """A plain pika consumer: ``handle(message_id, body)`` (whether it processed the
    message), then the ack, one message at a time."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=PREFETCH)
    window = Window(count)
    for method, properties, body in channel.consume(queue):
        last = window.settle(handle(properties.message_id, body))
        channel.basic_ack(method.delivery_tag)
        if last:
            break
    channel.cancel()
    connection.close()
    return window


def unguarded(amqp: str, queue: str, count: int, store: Any, insert: str) -> tuple[float, float]:
    def handle(message_id: str, body: bytes) -> bool:
        with store.transaction() as tx:
            tx.execute(insert, (message_id,))
        return True

    return plain(amqp, queue, count, handle).result()


def guarded(amqp: str, queue: str, count: int, store: Any, insert: str) -> tuple[float, float]:
    def handle(ctx: MessageContext) -> None:
        ctx.tx.execute(insert, (ctx.key,))

    consumer = Consumer(name=queue, handler=handle, transactional=True)
    window = Window(count)
    finished = threading.Event()

    def on_settled(message: Message, disposition: Disposition) -> None:
        if window.settle(disposition.outcome == "processed"):
            worker.stop()
            finished.set()

    worker = PikaConsumer(
        consumer, store, url=amqp, queue=queue, prefetch=PREFETCH, on_settled=on_settled
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    finished.wait()
    thread.join()
    return window.result()


class Hand:
    """The guarded consumer's statements, by hand: ``run(message_id, body)`` claims
    the message's key finished, writes the row and commits, or rolls back a duplicate."""

    def __init__(self, backend: str, target: str, queue: str, insert: str) -> None:
        consumer = Consumer(name=queue, handler=lambda ctx: None, transactional=True)
        # The values the store sends for every message of this consumer, made once.
        self.params: dict[str, Any] = {
            "scope": consumer.key_scope, "method": "CONSUME", "path": queue, "params": "{}",
            "flow": "consumer", "status": PROCESSED.status, "headers": "[]",
            "body": PROCESSED.body,
        }  # fmt: skip
        self.insert = insert
        if backend == "postgres":
            self.params.update(lock_timeout=consumer.lock_timeout, retention=consumer.retention)
            self.conn: Any = psycopg.connect(target, autocommit=True, prepare_threshold=0)
            self.conn.execute(SESSION_PLANNING, prepare=False)
            self.cursor = self.conn.cursor()
            queries = _queries.load("postgres")
            self.claim = bounded_claim(Query("claim_finished", queries["claim_finished"], {}), True)
            self.run = self._postgres
        else:
            assert consumer.retention is not None
            lock, retention = consumer.lock_timeout, consumer.retention
            self.params.update(
                lock_timeout=lock.total_seconds(), retention=retention.total_seconds()
            )
            self.conn = sqlite3.connect(target, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.claim = _queries.load("sqlite")["claim_insert_finished"]
            self.run = self._sqlite

    def _postgres(self, message_id: str, body: bytes) -> bool:
        conn = self.conn
        params = {**self.params, "key": message_id, "fingerprint": hashlib.sha256(body).hexdigest()}
        cur = self.cursor
        with conn.pipeline():
            conn.execute("BEGIN")
            cur.execute(self.claim, params)
        claimed = cur.fetchone()[0]  # the first column: whether it took the key
        if claimed:
            conn.execute(self.insert, (message_id,))
        conn.execute("COMMIT" if claimed else "ROLLBACK")
        return bool(claimed)

    def _sqlite(self, message_id: str, body: bytes) -> bool:
        conn = self.conn
        params = {**self.params, "key": message_id, "fingerprint": hashlib.sha256(body).hexdigest()}
        conn.execute("BEGIN IMMEDIATE")
        # All of RETURNING's rows: a statement left unfinished would stay active.
        claimed = bool(conn.execute(self.claim, params).fetchall())
        if claimed:
            conn.execute(self.insert, (message_id,))
        conn.execute("COMMIT" if claimed else "ROLLBACK")
        return bool(claimed)

    def close(self) -> None:
        self.conn.close()


def floor(
    amqp: str, queue: str, count: int, store: Any, insert: str, *, backend: str, target: str
) -> tuple[float, float]:
    hand = Hand(backend, target, queue, insert)
    try:
        return plain(amqp, queue, count, hand.run).result()
    finally:
        hand.close()


def measure(
    name: str, amqp: str, store: Any, insert: str, count: int, rounds: int, target: str
) -> dict[str, Any]:
    runs: dict[str, Callable[..., tuple[float, float]]] = {
        "unguarded": unguarded,
        "guarded": guarded,
        "floor": functools.partial(floor, backend=name, target=target),
    }
    rates: dict[str, list[float]] = {variant: [] for variant in runs}
    cpu: dict[str, list[float]] = {variant: [] for variant in runs}
    for round_ in range(rounds):
        # The order turns every round: a machine that slows down or warms up over a
        # run then weighs on every variant alike.
        order = list(runs.items())
        order = order[round_ % len(order) :] + order[: round_ % len(order)]
        for variant, run in order:
            queue = f"idem-bench-{variant}-{uuid.uuid4().hex[:8]}"
            publish(amqp, queue, count)
            try:
                rate, cpu_ms = run(amqp, queue, count, store, insert)
            finally:
                delete(amqp, queue)
            rates[variant].append(rate)
            cpu[variant].append(cpu_ms)
    best = {variant: max(values) for variant, values in rates.items()}
    least = {variant: min(values) for variant, values in cpu.items()}

    # A round's runs are back to back, so their ratio shares the machine's state of the
    # moment (a shared 2-core machine drifts by ±20 % over a minute); the median of
    # those paired ratios is the figure to judge, the best of each the other view.
    def paired(variant: str, baseline: str) -> float:
        pairs = zip(rates[variant], rates[baseline], strict=True)
        return round(statistics.median(a / b for a, b in pairs), 3)

    return {
        "store": name,
        "unguarded_per_s": round(best["unguarded"], 1),
        "guarded_per_s": round(best["guarded"], 1),
        "floor_per_s": round(best["floor"], 1),
        "ratio": paired("guarded", "unguarded"),
        "ratio_of_best": round(best["guarded"] / best["unguarded"], 3),
        "floor_ratio": paired("floor", "unguarded"),
        "guarded_vs_floor": paired("guarded", "floor"),
        "unguarded_cpu_ms": round(least["unguarded"], 3),
        "guarded_cpu_ms": round(least["guarded"], 3),
        "floor_cpu_ms": round(least["floor"], 3),
        "rounds": {variant: [round(v, 1) for v in values] for variant, values in rates.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=3000, help="messages per run (>= 2)")
    parser.add_argument("--quick", action="store_true", help="500 messages per run")
    parser.add_argument("--rounds", type=int, default=6, help="runs of each variant (>= 1)")
    parser.add_argument("--amqp", default=DEFAULT_AMQP, help="the RabbitMQ URL")
    parser.add_argument(
        "--postgres", default=os.environ.get("IDEMPOTENCE_TEST_POSTGRES", DEFAULT_POSTGRES)
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.rounds < 1 or args.messages < 2:
        parser.error("--rounds must be at least 1 and --messages at least 2")
    count = 500 if args.quick else args.messages
    table = "CREATE TABLE effects (message_id TEXT NOT NULL)"
    results = []
    name = f"idempotence_bench_consumers_{os.getpid()}"
    with psycopg.connect(args.postgres, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = make_conninfo(args.postgres, dbname=name)
        with PostgresStore(url) as store:
            store.migrate()
            with store.transaction() as tx:
                tx.execute(table)
        harness.in_service(url)
        with PostgresStore(url) as store:
            insert = "INSERT INTO effects (message_id) VALUES (%s)"
            results.append(measure("postgres", args.amqp, store, insert, count, args.rounds, url))
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            admin.execute(drop.format(sql.Identifier(name)))
    with tempfile.TemporaryDirectory() as tmp, SqliteStore(f"{tmp}/bench.sqlite3") as store:
        path = f"{tmp}/bench.sqlite3"
        store.migrate()
        with store.transaction() as tx:
            tx.execute(table)
        insert = "INSERT INTO effects (message_id) VALUES (?)"
        results.append(measure("sqlite", args.amqp, store, insert, count, args.rounds, path))
    if args.json:
        print(json.dumps({"messages": count, "results": results}))
        return
    host = conninfo_to_dict(args.postgres).get("host", "?")
    print(
        f"{count} messages per run, {args.rounds} rounds, one consumer, prefetch {PREFETCH}; "
        "ratios: the median of the rounds' paired ratios (best: of the best runs)"
    )
    print(f"(PostgreSQL at {host}, RabbitMQ at {args.amqp.split('@')[-1]})\n")
    print(
        f"{'store':<9}{'msg/s: unguarded':>17}{'guarded':>9}{'floor':>8}"
        f"{'ratio':>7}{'best':>7}{'floor/u':>8}{'g/floor':>8}"
        f"{'CPU ms/msg: unguarded, guarded, floor':>39}"
    )
    for row in results:
        cpu = f"{row['unguarded_cpu_ms']}, {row['guarded_cpu_ms']}, {row['floor_cpu_ms']}"
        print(
            f"{row['store']:<9}{row['unguarded_per_s']:>17}{row['guarded_per_s']:>9}"
            f"{row['floor_per_s']:>8}{row['ratio']:>7}{row['ratio_of_best']:>7}"
            f"{row['floor_ratio']:>8}{row['guarded_vs_floor']:>8}{cpu:>39}"
        )
    print(
        "\nratio: guarded / unguarded (target >= 0.7, transactional mode); floor/u: the same "
        "statements by hand / unguarded; g/floor: guarded / floor"
    )


if __name__ == "__main__":
    sys.exit(main())
