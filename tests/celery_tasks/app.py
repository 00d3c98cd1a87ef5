"""The Celery application the Celery tests run in real worker processes.

Configured from the environment the test gives the worker:

* ``CELERY_TEST_BROKER``, ``CELERY_TEST_QUEUE``: the broker and the test's own queue;
* ``CELERY_TEST_DB``: the key store and the effects table's database (a SQLite path or
  a PostgreSQL URL), ``CELERY_TEST_TABLE``: the effects table;
* ``CELERY_TEST_LOG``: a file each delivery, body run and success is appended to;
* ``CELERY_TEST_KILL``: where the worker SIGKILLs itself at its first task:
  ``before_claim`` (the task is delivered, nothing claimed), ``after_effect`` (the
  row is written in the claim's transaction, nothing committed) or ``after_commit``
  (the result is stored, the message not yet acknowledged).
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun, task_success

from idempotence import current_call
from idempotence.contrib.celery import idempotent_task

BROKER = os.environ.get("CELERY_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
QUEUE = os.environ.get("CELERY_TEST_QUEUE", "celery")
DB = os.environ.get("CELERY_TEST_DB", "")
TABLE = os.environ.get("CELERY_TEST_TABLE", "effects")
LOG = os.environ.get("CELERY_TEST_LOG", "")
KILL = os.environ.get("CELERY_TEST_KILL", "")

app = Celery("idempotence_tests", broker=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


def open_store() -> Any:
    if DB.startswith("postgresql://"):
        from idempotence.stores.postgres import PostgresStore

        return PostgresStore(DB)
    from idempotence import SqliteStore

    return SqliteStore(DB)


def log(kind: str, **fields: Any) -> None:
    with open(LOG, "a") as out:
        out.write(json.dumps({"kind": kind, **fields}) + "\n")


def kill(at: str) -> None:
    if at == KILL:
        os.kill(os.getpid(), signal.SIGKILL)


@task_prerun.connect
def _delivered(task_id: str, task: Any, args: Any, **_: Any) -> None:
    log("delivery", task_id=task_id, args=list(args or ()))
    kill("before_claim")


@task_postrun.connect
def _ran(task_id: str, **_: Any) -> None:
    kill("after_commit")


@task_success.connect
def _succeeded(sender: Any, result: Any, **_: Any) -> None:
    log("success", task_id=sender.request.id, result=result)


def _effect(ref: str) -> None:
    log("body", ref=ref)
    current_call().tx.execute(f"INSERT INTO {TABLE} (ref) VALUES (:ref)", {"ref": ref})
    kill("after_effect")


@idempotent_task(app, open_store, key="order_id", guard={"transactional": True}, name="place")
def place(order_id: str, amount: int) -> dict[str, Any]:
    _effect(order_id)
    return {"order": order_id, "amount": amount}


@idempotent_task(app, open_store, guard={"transactional": True}, name="by_id")
def by_id(amount: int) -> dict[str, Any]:
    key = current_call().key  # the task id
    _effect(key)
    return {"task": key, "amount": amount}
