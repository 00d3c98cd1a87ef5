"""Celery tasks guarded by ``@idempotent_task``, in real worker processes on the
machine's RabbitMQ, with late acknowledgement (DESIGN 12, M1, M2, F3).

Each test has its own queue and effects table; workers run the solo pool, so killing
the worker's process (SIGKILL) drops its connection and RabbitMQ delivers the
unacknowledged task again, to the next worker. Every task writes its effect row in
the claim's transaction (``transactional=True``), so "one effect" is one row.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest
from celery import Celery

from idempotence import SqliteStore
from idempotence.stores.postgres import PostgresStore
from tests.consumers.broker import broker_url
from tests.support.polling import eventually

# The slow tier: real Celery worker processes, killed and restarted.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BROKER = "amqp://guest:guest@127.0.0.1:5672//"


@dataclass
class Rig:
    """A test's queue, database, effects table and log, and its workers."""

    queue: str
    db: str
    table: str
    log: Path
    workdir: Path
    publisher: Celery
    workers: list[subprocess.Popen[bytes]]

    def worker(self, kill: str = "") -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "CELERY_TEST_BROKER": BROKER,
            "CELERY_TEST_QUEUE": self.queue,
            "CELERY_TEST_DB": self.db,
            "CELERY_TEST_TABLE": self.table,
            "CELERY_TEST_LOG": str(self.log),
            "CELERY_TEST_KILL": kill,
        }
        name = f"w{len(self.workers)}-{uuid.uuid4().hex[:6]}@%h"
        output = open(self.workdir / f"worker{len(self.workers)}.log", "wb")  # noqa: SIM115
        process = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "tests.celery_tasks.app", "worker",
                "--pool=solo", "-Q", self.queue, "-n", name, "-l", "WARNING",
                "--without-heartbeat", "--without-gossip", "--without-mingle",
            ],
            cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.workers.append(process)
        return process

    def send(self, name: str, args: list[Any], task_id: str | None = None) -> str:
        task_id = task_id or str(uuid.uuid4())
        self.publisher.send_task(name, args=args, queue=self.queue, task_id=task_id)
        return task_id

    def entries(self, kind: str) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [entry for entry in map(json.loads, lines) if entry["kind"] == kind]

    def rows(self) -> list[str]:
        store: Any = (
            PostgresStore(self.db) if self.db.startswith("postgresql") else SqliteStore(self.db)
        )
        with store, store.transaction() as tx:
            rows = tx.execute(f"SELECT ref FROM {self.table}")
        return sorted(next(iter(row.values())) if isinstance(row, dict) else row[0] for row in rows)

    def stop(self) -> None:
        # The test is over and its queue goes next: nothing is left to shut down
        # gracefully (a solo worker took 10 s to give up on a SIGQUIT).
        for process in self.workers:
            if process.poll() is None:
                process.kill()
        for process in self.workers:
            process.wait()


def _rig(db: str, tmp_path: Path) -> Iterator[Rig]:
    broker_url()  # fails loudly without a broker
    table = f"fn_celery_{uuid.uuid4().hex[:10]}"
    store: Any = PostgresStore(db) if db.startswith("postgresql") else SqliteStore(db)
    with store, store.transaction() as tx:
        tx.execute(f"CREATE TABLE {table} (ref VARCHAR(100) NOT NULL)")
    queue = f"idem-celery-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    publisher = Celery("publisher", broker=BROKER)
    rig = Rig(queue, db, table, tmp_path / "log.jsonl", tmp_path, publisher, [])
    try:
        yield rig
    finally:
        rig.stop()
        publisher.close()
        connection = pika.BlockingConnection(pika.URLParameters(broker_url()))
        try:
            connection.channel().queue_delete(queue)
        finally:
            connection.close()


@pytest.fixture
def sqlite_rig(sqlite_path: str, tmp_path: Path) -> Iterator[Rig]:
    yield from _rig(sqlite_path, tmp_path)


@pytest.fixture
def pg_rig(pg_url: str, tmp_path: Path) -> Iterator[Rig]:
    yield from _rig(pg_url, tmp_path)


@pytest.mark.parametrize(
    ("kill", "body_runs", "successes"),
    # after_commit: the dead worker's task had succeeded (and said so) before it died,
    # unacknowledged; the second delivery replays the stored result.
    [("before_claim", 1, 1), ("after_effect", 2, 1), ("after_commit", 1, 2)],
)
def test_a_worker_killed_anywhere_leaves_one_effect(
    sqlite_rig: Rig, kill: str, body_runs: int, successes: int
) -> None:
    rig = sqlite_rig
    first = rig.worker(kill=kill)
    order = f"o-{uuid.uuid4().hex[:8]}"
    task = rig.send("place", [order, 500])
    assert first.wait(timeout=60) == -signal.SIGKILL
    rig.worker()
    eventually(lambda: len(rig.entries("delivery")) == 2, "the task's second delivery", timeout=60)
    eventually(lambda: len(rig.entries("success")) == successes, "the task to succeed", timeout=60)
    for entry in rig.entries("success"):
        assert entry["task_id"] == task
        assert entry["result"] == {"order": order, "amount": 500}
    assert len(rig.entries("body")) == body_runs
    assert rig.rows() == [order]


def test_the_same_task_published_twice_runs_once_and_both_get_its_result(
    sqlite_rig: Rig,
) -> None:
    rig = sqlite_rig
    rig.worker()
    task = str(uuid.uuid4())
    rig.send("by_id", [7], task_id=task)
    rig.send("by_id", [7], task_id=task)  # a publisher's retry: the same task id
    order = f"o-{uuid.uuid4().hex[:8]}"
    rig.send("place", [order, 1])
    rig.send("place", [order, 1])  # another task for the same order
    eventually(lambda: len(rig.entries("success")) == 4, "four successes", timeout=60)
    results = [entry["result"] for entry in rig.entries("success")]
    assert results.count({"task": task, "amount": 7}) == 2
    assert results.count({"order": order, "amount": 1}) == 2
    assert len(rig.entries("body")) == 2
    assert rig.rows() == sorted([task, order])


@pytest.mark.slow
def test_200_tasks_with_duplicates_on_two_workers_leave_one_effect_each(pg_rig: Rig) -> None:
    rig = pg_rig
    orders = [f"o-{i}-{uuid.uuid4().hex[:6]}" for i in range(100)]
    messages: list[tuple[str, str | None]] = []
    for i, order in enumerate(orders):
        # Half repeat their task id (a publisher's retry), half are a second task.
        task_id = str(uuid.uuid4()) if i % 2 else None
        messages += [(order, task_id), (order, task_id)]
    random.Random(32).shuffle(messages)
    for order, task_id in messages:
        rig.send("place", [order, 1], task_id=task_id)
    rig.worker()
    rig.worker()
    eventually(lambda: len(rig.entries("success")) == 200, "200 successes", timeout=120)
    assert rig.rows() == sorted(orders)  # each exactly once
    assert Counter(entry["result"]["order"] for entry in rig.entries("success")) == {
        order: 2 for order in orders
    }
