"""How a pooled store lives through its database going away and coming back (P11):
what it knows of the server's health, and how long a request may wait for a
connection. Pure bookkeeping (a clock and a state), shared by the sync and the async
PostgreSQL store; the I/O is theirs.

Three states:

- healthy: a checkout waits for a connection as long as the pool's own timeout (a
  busy pool is not a dead server), in slices of `FAIL_FAST` seconds, so that
  it stops waiting once the server turns out to be gone (the store's checkouts take
  turns to wait in the pool's queue, so one that slices keeps its place there);
- suspect: a connection turned out broken (the server closed it, or it died under a
  statement). A checkout waits at most `FAIL_FAST` seconds, so a request is
  answered 503 within a second if the server is really gone;
- down: the pool could not connect, or a suspect checkout timed out. A checkout
  fails at once, but one every `PROBE_INTERVAL` seconds is let through to try
  (waiting at most `FAIL_FAST`): the first that gets a connection makes the
  store healthy again, within about a second of the server accepting connections.

An outage is logged once, as a warning on ``idempotence.stores``, and its end once,
at INFO: no line per request or per pass of a worker.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from typing import Any

from ...errors import StoreUnavailable

logger = logging.getLogger("idempotence.stores")

FAIL_FAST = 0.5
"""Seconds a checkout waits for a connection while the server is suspect or down."""
PROBE_INTERVAL = 0.5
"""Seconds between the checkouts let through to try a server known to be down."""

_HEALTHY, _SUSPECT, _DOWN = 0, 1, 2

connect_errors: dict[str, str] = {}
"""The last reason each of the store's pools failed to connect, by pool name (the
pool's own log tells it; its ``reconnect_failed`` callback does not)."""


class Breaker:
    """The health of one pool's server (see the module docstring)."""

    def __init__(self, pool: str = "", what: str = "PostgreSQL") -> None:
        self._pool = pool  # its name, for the reason it last failed to connect
        self._what = what
        self._state = _HEALTHY
        self._reason = ""
        self._probe_at = 0.0
        # The sync store's threads (a worker's services, a threaded server) meet an
        # outage together: the transitions that log take turns, so an outage and its
        # end are logged once each. Held for a state change only, never across I/O.
        self._lock = threading.Lock()

    def deadline(self) -> float:
        """When a checkout that has just met a dead connection stops waiting."""
        return time.monotonic() + FAIL_FAST

    def check(self) -> None:
        """Raise [`StoreUnavailable`][idempotence.errors.StoreUnavailable] while the server is down
        and no probe is due (what `timeout` would, without letting a probe
        through)."""
        if self._state == _DOWN and time.monotonic() < self._probe_at:
            raise StoreUnavailable(f"{self._what} is unavailable: {self._reason}")

    def timeout(self, deadline: float | None = None) -> float:
        """How long the next checkout may wait (while healthy: a slice of it), at
        most until ``deadline``; raises [`StoreUnavailable`][idempotence.errors.StoreUnavailable]
        at once while the server is down and no probe is due."""
        if deadline is not None:
            return max(deadline - time.monotonic(), 0.001)
        if self._state == _HEALTHY:
            return FAIL_FAST  # a slice: the caller waits again while healthy
        if self._state == _DOWN:
            self.check()
            self._probe_at = time.monotonic() + PROBE_INTERVAL  # this checkout probes
        return FAIL_FAST

    def broken(self, reason: object) -> None:
        """A connection turned out dead: the server may be gone."""
        if self._state == _HEALTHY:
            self._state, self._reason = _SUSPECT, _line(reason)

    def timed_out(self, reason: object) -> StoreUnavailable:
        """A checkout of a troubled server ran out of time: it is down. Returns the
        error to raise, with the pool's own reason when it has one."""
        self.down(reason)
        return StoreUnavailable(f"{self._what} is unavailable: {self._reason}")

    def down(self, reason: object = "cannot connect") -> None:
        """The server cannot be reached (the pool's connection attempts failed)."""
        reason = _line(connect_errors.get(self._pool) or reason)
        with self._lock:
            was = self._state
            self._state, self._reason = _DOWN, reason
            self._probe_at = time.monotonic() + PROBE_INTERVAL
        if was != _DOWN:
            logger.warning(
                "%s is unavailable (%s): operations fail at once until it is back",
                self._what,
                reason,
                extra={"unavailable": True},
            )

    def reconnect_failed(self, pool: Any) -> None:
        """The pool's ``reconnect_failed`` callback."""
        self.down("cannot connect")

    def healthy(self) -> None:
        """A checkout got a live connection (call only when `troubled`)."""
        with self._lock:
            was, self._state = self._state, _HEALTHY
        if was == _DOWN:
            logger.info("%s is available again", self._what, extra={"unavailable": False})
        connect_errors.pop(self._pool, None)

    @property
    def troubled(self) -> bool:
        return self._state != _HEALTHY


def _line(reason: object) -> str:
    return " ".join(str(reason).split()) or type(reason).__name__


try:
    _poll: Any = select.poll
except AttributeError:  # pragma: no cover - Windows has no poll()
    _poll = None


def closed_by_server(fd: int) -> bool:
    """Whether an idle connection's socket has something to read: an idle store
    connection is sent nothing, unless the server closed it (a restart), or is
    about to and says why. One system call, no round trip."""
    if _poll is None:  # pragma: no cover
        return bool(select.select([fd], [], [], 0)[0])
    poller = _poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
