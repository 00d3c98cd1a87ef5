"""The FastAPI example (examples/fastapi_sqlalchemy.py) with a crash point for the
tests: with ``CRASH_BEFORE_COMMIT=1`` the server SIGKILLs itself at the COMMIT of the
first transaction that wrote a transfer, after the ORM row and the stored response
were sent to the database and before the COMMIT is."""

from __future__ import annotations

import os
import signal
from typing import Any

from fastapi_sqlalchemy import Transfer, app, engine  # examples/ on the app dir
from sqlalchemy import event
from sqlalchemy.orm import Session

__all__ = ["app"]

if os.environ.get("CRASH_BEFORE_COMMIT") == "1":

    @event.listens_for(Session, "after_flush")
    def _wrote(session: Session, context: Any) -> None:
        if any(isinstance(row, Transfer) for row in session.new):
            session.connection().info["wrote_transfer"] = True

    @event.listens_for(engine.sync_engine, "commit")
    def _crash(conn: Any) -> None:
        if conn.info.pop("wrote_transfer", False):
            os.kill(os.getpid(), signal.SIGKILL)
