"""A client-side deadline for statements the server will not end (DESIGN 13).

``statement_timeout`` is the server's: it ends a statement that runs or waits for a
lock, but not a COMMIT waiting for a synchronous standby (PostgreSQL disables the
timeout before it commits), so a store on a primary whose synchronous standby is gone
would wait without end. The watchdog is one daemon thread per store: it looks at the
connections the store has checked out, a few times a second, and sends a cancel
request (``Connection.cancel()``, which opens a connection of its own) for one that
has been busy on the server for longer than the bound. A cancelled COMMIT wait ends
with the server's warning that the transaction committed locally, and no error: the
watchdog remembers the connection it cancelled, and the store reports the operation
failed (StoreUnavailable, `unwatch`), since what committed on the primary alone is
what a failover to the standby loses. Any other cancelled statement ends in
QueryCanceled (StoreUnavailable) anyway. The thread, not the
request, pays for the cancel's connection, so a partitioned server cannot hold the
request past the bound either (the keepalives end that one).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from psycopg import capabilities, generators, pq, waiting

logger = logging.getLogger("idempotence.stores")

NOT_REPLICATED = (
    "PostgreSQL committed on the primary, but no synchronous standby confirmed it within "
    "statement_timeout: not reported done, since a failover to the standby would lose it "
    "(retry; a standby behind or gone is the cause)"
)
"""The error of an operation whose COMMIT the watchdog cancelled (see `Watchdog.unwatch`)."""

GRACE = 0.5
"""Past the server's own timeout: the watchdog is for waits the server does not end."""


class Watchdog:
    def __init__(self, bound: float) -> None:
        self.bound = bound + GRACE
        self._interval = min(0.25, bound / 4)
        self._lock = threading.Lock()
        #: Each watched connection, and since when it has been seen busy (or None).
        self._busy: dict[Any, float | None] = {}
        #: The watched connections whose statement was cancelled while watched.
        self._cancelled: set[Any] = set()
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, raw: Any) -> None:
        with self._lock:
            self._busy[raw] = None
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="idempotence-postgres-watchdog", daemon=True
                )
                self._thread.start()

    def unwatch(self, raw: Any) -> bool:
        """Stop watching ``raw``; whether a statement of it was cancelled meanwhile."""
        with self._lock:
            self._busy.pop(raw, None)
            if raw in self._cancelled:
                self._cancelled.discard(raw)
                return True
            return False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._busy.clear()
            self._cancelled.clear()

    def _run(self) -> None:
        while True:
            time.sleep(self._interval)
            now = time.monotonic()
            late = []
            with self._lock:
                if self._closed:
                    return
                for raw, since in self._busy.items():
                    # ACTIVE: a command is on its way or running. Seen so at every
                    # look for longer than the bound, it is one the server will not end.
                    if raw.closed or raw.pgconn.transaction_status != pq.TransactionStatus.ACTIVE:
                        self._busy[raw] = None
                    elif since is None:
                        self._busy[raw] = now
                    elif now - since >= self.bound:
                        self._busy[raw] = None
                        self._cancelled.add(raw)
                        late.append(raw)
            for raw in late:
                logger.warning(
                    "a statement ran past statement_timeout (%g s) without the server ending "
                    "it (a COMMIT waiting for a synchronous standby?): cancelling it",
                    self.bound - GRACE,
                )
                try:
                    cancel(raw, timeout=self.bound)
                except Exception as exc:  # the server unreachable: keepalives end it
                    logger.warning("could not cancel the statement: %s", exc)


def cancel(raw: Any, timeout: float) -> None:
    """Send a cancel request for ``raw``'s statement, giving up after ``timeout``.

    Not ``raw.cancel()``: libpq's PQcancel connects with no timeout, and psycopg's
    binary build holds the interpreter lock meanwhile, so against an unreachable server
    (a partition) it froze the whole process for the seconds the connect took. libpq 17
    and later cancel without blocking; psycopg drives that with a timeout.
    """
    if not capabilities.has_cancel_safe():
        raw.cancel()
        return
    cancel_conn = raw.pgconn.cancel_conn()
    cancel_conn.start()
    waiting.wait_conn(generators.cancel(cancel_conn), interval=0.1, timeout=timeout)
