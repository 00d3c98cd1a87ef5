"""``@idempotent`` on DjangoStore, in a process of its own (Django's settings are
process-wide): for test_django.py.

    python -m tests.functions.django_child '{"database": ..., "table": ...}'

Prints one JSON line: what the racing callers got, how often each body ran, and the
rows the transactional body left.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import django
from django.conf import settings


def configure(database: str) -> None:
    if database.startswith("postgresql://"):
        url = urlsplit(database)
        db: dict[str, Any] = {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": url.hostname,
            "PORT": str(url.port or 5432),
            "NAME": url.path.lstrip("/"),
            "USER": url.username or "postgres",
        }
    else:
        db = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": database,
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    settings.configure(
        DATABASES={"default": db},
        INSTALLED_APPS=["idempotence.contrib.django_app"],
        USE_TZ=True,
        LOGGING_CONFIG=None,
    )
    django.setup()


def main(raw: str) -> None:
    spec = json.loads(raw)
    configure(spec["database"])
    from django.core.management import call_command
    from django.db import connection, connections

    from idempotence import CallInProgress, current_call, idempotent
    from idempotence.contrib.django_app.store import DjangoStore

    call_command("migrate", verbosity=0)
    table = spec["table"]
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {table} (ref VARCHAR(100) NOT NULL)")
    store = DjangoStore()
    runs: Counter[str] = Counter()
    lock, gate = threading.Lock(), threading.Event()

    @idempotent(store, key="order_id", name="django-plain")
    def plain(order_id: str) -> dict[str, str]:
        with lock:
            runs["plain"] += 1
        gate.wait(10)
        return {"order": order_id}

    @idempotent(store, key="order_id", name="django-tx", transactional=True)
    def place(order_id: str, fail: bool = False) -> int:
        with lock:
            runs["tx"] += 1
        current_call().tx.execute(f"INSERT INTO {table} (ref) VALUES (:ref)", {"ref": order_id})
        if fail:
            raise RuntimeError("roll back")
        return 1

    outcomes: list[str] = []

    def call(fn: Any, *args: Any) -> None:
        try:
            outcomes.append(json.dumps(fn(*args)))
        except CallInProgress:
            outcomes.append("in_progress")
        finally:
            connections.close_all()

    first = threading.Thread(target=call, args=(plain, "o-1"))
    first.start()
    while not runs["plain"]:
        gate.wait(0.01)
    racers = [threading.Thread(target=call, args=(plain, "o-1")) for _ in range(4)]
    for thread in racers:
        thread.start()
    for thread in racers:
        thread.join(30)
    gate.set()
    first.join(30)
    call(plain, "o-1")
    with contextlib.suppress(RuntimeError):
        place("o-2", True)
    rolled_back = store.get("django-tx", "o-2") is None
    results = [place("o-2"), place("o-2")]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT ref FROM {table}")
        rows = [row[0] for row in cursor.fetchall()]
    print(
        json.dumps(
            {
                "outcomes": sorted(outcomes),
                "runs": dict(runs),
                "rolled_back": rolled_back,
                "results": results,
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
