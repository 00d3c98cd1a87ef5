"""P10 on PostgreSQL: a duplicate waiting for its twin is woken by LISTEN/NOTIFY.

This module holds what the listeners share; the listener itself is written in
`_listener_async`, and `_listener` is generated from it.

Each store has at most one listener: a connection of its own (never one of the pool's:
a LISTENing connection stays open and idle for as long as the store lives), opened at
the first wait, that LISTENs on the channel of ``mark_waiter`` (see
``sql/postgres/queries.sql``) and hands every notification to the store's
`Waiters`. The sync store reads it on a daemon thread, the async one
on a task of the event loop that first waited (`idempotence._concurrency`'s
``Background`` and ``AsyncBackground``).

A wait (``Listener.wait``, ``AsyncListener.wait``) goes:

1. register the waiter and make sure the LISTEN is active (connecting if need be);
2. mark the key as waited for. Only now: a settle that commits after the mark sends a
   NOTIFY that the listener is already subscribed to. No row marked means the key
   settled since the claim, so the wait ends at once and the caller claims again;
3. wait for the notification, at most ``seconds``; forget the waiter.

The caller's bounded pause is the upper bound of every wait, so correctness never
depends on a notification arriving: one only ends a wait early. If the listener cannot
connect, or its connection dies, waits just sleep (a warning is logged) and the next
wait connects again. A waiter whose scope is too long for a NOTIFY payload sleeps too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ._sql.ops import Dialect, Op

logger = logging.getLogger("idempotence.stores")

APPLICATION_NAME = "idempotence-listener"
"""How the listener's connection shows in ``pg_stat_activity``, unless the
application named its connections itself."""

STOP_CHECK = 0.2
"""The listener looks up from the socket this often to notice that the store is
closing (a thread blocked on a socket cannot be interrupted)."""


def mark_waiter(d: Dialect, scope: str, key: str) -> Op[bool]:
    """Ask to be notified when the key settles; False when it already has (P10)."""
    rows = yield d.query("mark_waiter", scope=scope, key=key)
    return bool(rows)


class ListenerBase:
    """What the sync and the async listener share: where to connect, and the log."""

    backend = "PostgreSQL"
    """The server named in the log (the Redis store's listener shares the waiting)."""

    def __init__(
        self, dialect: Dialect, conninfo: str, kwargs: Mapping[str, Any], connect_timeout: float
    ) -> None:
        self._conninfo = conninfo
        options = dict(kwargs)
        options.update(autocommit=True, connect_timeout=max(int(connect_timeout), 1))
        if "application_name" not in options and "application_name" not in _parsed(conninfo):
            options["application_name"] = APPLICATION_NAME
        self._options = options
        self._listen = dialect.queries["listen"]
        self._closed = False
        self._healthy = True

    def _failed(self, exc: BaseException) -> None:
        if self._closed:
            return  # closing the store ends the connection: not a failure
        # One warning per outage, not one per waiting request.
        level = logging.WARNING if self._healthy else logging.DEBUG
        self._healthy = False
        logger.log(
            level,
            "the %s listener connection failed (%s): duplicates waiting for their "
            "twin poll until the next wait reconnects it",
            self.backend,
            exc,
        )

    def _connected(self) -> None:
        if not self._healthy:
            logger.info("the %s listener connection is back", self.backend)
        self._healthy = True


def _parsed(conninfo: str) -> dict[str, Any]:
    try:
        return conninfo_to_dict(conninfo)
    except psycopg.Error:
        return {}  # the connect itself will say what is wrong with it
