"""The FastAPI example (examples/fastapi_sqlalchemy.py) with a crash point for the
tests: with ``CRASH_BEFORE_COMMIT=1`` the server SIGKILLs itself at the first COMMIT
that follows the statement storing a response (the key's finish), so after the ORM
row and the stored response were sent to the database and before that COMMIT is.

The point is the finish's, not the ORM write's: an implementation that committed the
ORM write (or the claim) in a transaction of its own, earlier, would leave it behind."""

from __future__ import annotations

import os
import signal
from typing import Any

from fastapi_sqlalchemy import app, engine  # examples/ on the app dir
from sqlalchemy import event

__all__ = ["app"]

if os.environ.get("CRASH_BEFORE_COMMIT") == "1":

    @event.listens_for(engine.sync_engine, "after_cursor_execute")
    def _finishing(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().startswith("UPDATE idempotency_keys") and (
            "recovery_point = 'finished'" in statement
        ):
            conn.info["finished"] = True

    @event.listens_for(engine.sync_engine, "commit")
    def _crash(conn: Any) -> None:
        if conn.info.pop("finished", False):
            os.kill(os.getpid(), signal.SIGKILL)
