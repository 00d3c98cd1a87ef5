"""Partitions between a guarded RabbitMQ consumer and its key store (DESIGN 13; issue
35 item 4).

The consumer (tests/network/consumer.py: aio-pika, the PostgreSQL store) runs in an app
host's namespace. It reaches the broker over the front link, which stays up, and its
store over the back link, through a relay that adds latency so that the test can cut
the link while the claim, the handler or the finish (in transaction mode: the COMMIT)
is in flight. The cut lasts less than the lock timeout. Then the history checker
judges the deliveries as a client's attempts (an ack is a final answer; a requeue
for a key in progress a 409; a requeue because the store failed a 503): the message is
acked only once its key is finished in the store (never before: the adapter requeues
it while the store is cut off), the handler ran once (handler mode) or wrote its one
row (transaction mode), and the message settled within the lock timeout plus a
heartbeat interval of the heal.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from idempotence.stores.postgres import PostgresStore
from idempotence.testing import History
from tests.consumers.broker import Broker, broker_url, queue_for_test
from tests.support.polling import eventually

from .hosts import ROOT, AppHost, Relay, stop
from .test_partitions import FAIL_WITHIN, RELAY_DELAY, over, relayed

#: The consumer's lock timeout (s): longer than the cut, so that a finish tried again
#: in the background lands before it lapses.
LOCK = 6.0
CUT = 2.5
#: How long the handler works after its effect: in transaction mode less than the
#: store's bound (1 s), past which the server ends a transaction left idle.
WORK = {"handler": 1.5, "transaction": 0.5}
#: A message settles within the lock plus a heartbeat interval of the heal, plus a
#: cut-off statement's bound and the requeue delays.
SETTLE = LOCK + LOCK / 3 + FAIL_WITHIN + 2.0
STATUS = {"processed": 200, "duplicate": 200, "in_progress": 409, "dead_letter": 422}


@dataclass
class Running:
    host: AppHost
    relay: Relay
    broker: Broker
    queue: str
    ledger: Path
    database: str
    mode: str

    def rows(self, sql: str, *params: object) -> list[tuple[object, ...]]:
        with contextlib.closing(sqlite3.connect(self.ledger, timeout=10)) as db:
            return list(db.execute(sql, params))

    def acked(self, key: str) -> bool:
        return bool(self.rows("SELECT 1 FROM deliveries WHERE key = ? AND action = 'ack'", key))

    def began(self, key: str) -> bool:
        return bool(self.rows("SELECT 1 FROM begun WHERE key = ?", key))

    def ran(self, key: str) -> bool:
        return bool(self.rows("SELECT 1 FROM runs WHERE key = ?", key))

    def history(self) -> History:
        """The deliveries as a history: each one an attempt of its message's key, and
        each effect (a run of the handler, a committed row) an effect."""
        history = History()
        for key, _action, outcome, started, ended in self.rows(
            "SELECT key, action, outcome, started, ended FROM deliveries ORDER BY ended"
        ):
            # An ack is a final answer; a requeue a transient one (in progress: a 409; the
            # store failed, or the handler: a 503).
            history.record(key, STATUS.get(outcome, 503), b"", started=started, ended=ended)
        if self.mode == "handler":
            for n, (key,) in enumerate(self.rows("SELECT key FROM runs")):
                history.effect(key, f"run {n}")
        else:
            with psycopg.connect(self.database) as conn:
                for key, lease in conn.execute("SELECT key, id FROM net_transfers"):
                    history.effect(key, f"row of lease {lease}")
        return history


@contextlib.contextmanager
def consuming(app_host: AppHost, database: str, tmp_path: Path, mode: str) -> Iterator[Running]:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("CREATE TABLE net_transfers (key TEXT NOT NULL, id TEXT NOT NULL)")
    relay = relayed(app_host, database, 5432)
    amqp = broker_url()
    broker_relay = relayed(app_host, "amqp://127.0.0.1:5672", 5672, app_host.front)
    ledger = tmp_path / "ledger.sqlite3"
    with queue_for_test(amqp) as (broker, queue):
        process = subprocess.Popen(
            [
                *app_host.exec_prefix(), sys.executable, "-m", "tests.network.consumer",
                mode, over(relay, database), over(broker_relay, amqp), queue, str(ledger),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "IDEM_WORK": str(WORK[mode]),
                 "IDEM_LOCK": str(LOCK)},
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready", "the consumer did not start"
            yield Running(app_host, relay, broker, queue, ledger, database, mode)
        finally:
            stop(process, grace=15)


BOUNDARIES = [
    pytest.param("handler", "claim", id="handler-claim", marks=pytest.mark.slow),
    pytest.param("handler", "handler", id="handler-during"),
    pytest.param("handler", "finish", id="handler-finish", marks=pytest.mark.slow),
    pytest.param("transaction", "claim", id="transaction-claim", marks=pytest.mark.slow),
    pytest.param("transaction", "handler", id="transaction-during", marks=pytest.mark.slow),
    pytest.param("transaction", "finish", id="transaction-commit"),
]


@pytest.mark.parametrize(("mode", "boundary"), BOUNDARIES)
def test_a_partition_between_a_consumer_and_its_store_keeps_every_promise(
    app_host: AppHost, fresh_pg_url: str, tmp_path: Path, mode: str, boundary: str
) -> None:
    key = f"msg-{boundary}"
    with consuming(app_host, fresh_pg_url, tmp_path, mode) as run:
        run.broker.publish(run.queue, b"warm", message_id=f"{key}-warm")
        eventually(lambda: run.acked(f"{key}-warm"), "the warm message's ack", timeout=30)
        run.relay.delay = RELAY_DELAY
        run.broker.publish(run.queue, b"{}", message_id=key)
        eventually(lambda: run.began(key), "the delivery", timeout=30)
        work = WORK[mode]
        if boundary == "claim":
            time.sleep(RELAY_DELAY / 2)  # the claim sits in the relay's delay
        elif mode == "handler":
            eventually(lambda: run.ran(key), "the handler's run", timeout=30)
            # During: the handler works; finish: its finish sits in the relay.
            time.sleep(work / 3 if boundary == "handler" else work + RELAY_DELAY / 2)
        else:
            # The claim opens the transaction (a delayed round trip), the handler
            # writes (another), then works; its COMMIT follows.
            time.sleep(2 * RELAY_DELAY + (work / 3 if boundary == "handler" else work + 0.9))
        with app_host.back.partitioned():
            cut = time.monotonic()
            time.sleep(CUT)
        healed_at = time.monotonic()
        run.relay.delay = 0.0
        eventually(lambda: run.acked(key), "the message's ack after the heal", timeout=SETTLE + 10)
        history = run.history()
        with PostgresStore(fresh_pg_url) as store:
            records = {k: store.get(run.queue, k) for k in (key, f"{key}-warm")}
        deliveries = run.rows(
            "SELECT action, outcome, started, ended FROM deliveries WHERE key = ?", key
        )
    for action, outcome, started, ended in deliveries:
        print(f"  {action} {outcome} {started - cut:+.2f}..{ended - cut:+.2f} s")
    report = history.check(records=records, healed_at=healed_at, settle_within=SETTLE)
    print(report)
    report.assert_ok()
    # Never acked before its key was stored: an ack's key is finished (the checker's
    # lost answer), and the one effect is the message's only one.
    assert sum(1 for e in history.effects if e.key == key) == 1
    assert records[key] is not None and records[key].finished
