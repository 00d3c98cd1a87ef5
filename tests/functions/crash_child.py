"""A guarded call killed mid-run (SIGKILL), for test_crash.py.

    python -m tests.functions.crash_child SPEC_JSON

The spec names the store, the key and the mode: ``transactional`` (a SQL store: the
body writes its row in the claim's transaction, then dies before the COMMIT) or
``handler`` (any store: the body notes that it entered, then dies before its effect,
while it holds the key's lock).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from idempotence import current_call, idempotent

LOCK_TIMEOUT = timedelta(seconds=2)


def open_store(spec: dict[str, Any]) -> Any:
    backend = spec["backend"]
    if backend == "sqlite":
        from idempotence import SqliteStore

        return SqliteStore(spec["url"])
    if backend == "postgres":
        from idempotence.stores.postgres import PostgresStore

        return PostgresStore(spec["url"])
    from idempotence.stores.redis import RedisStore

    return RedisStore(spec["url"], prefix=spec["prefix"])


def build(store: Any, spec: dict[str, Any], kill: bool) -> Any:
    """The guarded function, the same in the child and in the test."""
    transactional = spec["mode"] == "transactional"

    def place(order_id: str, amount: int) -> int:
        if transactional:
            # The write, then the death: both in the claim's transaction (F3).
            current_call().tx.execute(
                f"INSERT INTO {spec['table']} (ref) VALUES (:ref)", {"ref": order_id}
            )
            if kill:
                os.kill(os.getpid(), signal.SIGKILL)
            return amount
        with open(spec["effects"], "a") as effects:
            effects.write(f"entered {order_id}\n")
            effects.flush()
            if kill:
                os.kill(os.getpid(), signal.SIGKILL)  # mid-run, before the effect
            effects.write(f"effect {order_id}\n")
        return amount

    return idempotent(
        store,
        key="order_id",
        name="crash-place",
        transactional=transactional,
        lock_timeout=LOCK_TIMEOUT,
        heartbeat=None if transactional else timedelta(seconds=0.5),
    )(place)


def main(raw: str) -> int:
    spec = json.loads(raw)
    store = open_store(spec)
    if spec.get("ready"):
        Path(spec["ready"]).write_text("claiming")
    build(store, spec, kill=True)(spec["key"], 100)
    return 1  # never reached: the body kills the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
