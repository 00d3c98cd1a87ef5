"""Ticks while a block runs: the heartbeats of every running handler (F2).

A guarded request or call beats for its lock every few seconds while its handler
runs, and most handlers return long before the first beat. So what a block costs
when it never ticks is what matters: entering and leaving it is a dict entry added and
removed, and every block of the process (sync) or of the event loop (async) is
ticked by one scheduler:

* sync, `Periodic`: one daemon thread of the process, `_Ticker` (a thread started per
  block cost about 120 µs of CPU, a tenth of a guarded request);
* async, `AsyncPeriodic`: one timer of each event loop, `_LoopTicker` (a task per
  block cost about 12 µs; a timer per block a few, and left a cancelled timer behind
  in the loop's queue for each).

A scheduler keeps only the running blocks, each with the time its next tick is due,
and sleeps until the soonest (at most `IDLE` seconds, so that the many blocks that end
before their first tick never need to wake it): an ended block leaves nothing behind
to wake for later. A block whose tick is due before the scheduler would wake wakes it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["IDLE", "AsyncPeriodic", "Periodic"]

IDLE = 1.0
"""The longest a scheduler sleeps while blocks run: a block due later than that (a
heartbeat is due seconds after its block began) does not wake it."""

logger = logging.getLogger("idempotence")


def _due(entries: dict[Any, float], now: float) -> list[Any]:
    """The entries due by ``now``, taken out of ``entries``."""
    ready = [entry for entry, at in entries.items() if at <= now]
    for entry in ready:
        del entries[entry]
    return ready


def _next_wake(entries: dict[Any, float], now: float, busy: bool) -> float:
    """When a scheduler wakes next: at the soonest entry, at most `IDLE` from ``now``
    while blocks come and go (``busy``), and never (inf) when none has for a while."""
    if not entries and not busy:
        return math.inf
    return min(min(entries.values(), default=math.inf), now + IDLE)


class Periodic:
    """While its ``with`` block runs, call ``tick()`` every ``seconds``, until ``tick``
    returns False or `stop`; None never ticks.

    The ticks of every ``Periodic`` run on one daemon thread of the process (see the
    module). The block's end stops it and waits for a tick in flight: nothing ticks
    after it.
    """

    __slots__ = ("_args", "_seconds", "_tick", "stopped")

    def __init__(
        self, name: str, seconds: float | None, tick: Callable[..., bool], *args: Any
    ) -> None:
        self._seconds = seconds
        self._tick = tick
        self._args = args
        self.stopped = False

    def start(self) -> Periodic:
        """Begin the block (``with`` does): ``halt``, then ``stop`` if it says so,
        end it."""
        if self._seconds is not None:
            _TICKER.add(self, self._seconds)
        return self

    __enter__ = start

    def halt(self) -> bool:
        """End the block: stop ticking, once a tick in flight has returned. False:
        there is nothing left for `stop` to wait for (it is `AsyncPeriodic`'s twin)."""
        if self._seconds is not None:
            _TICKER.remove(self)
        return False

    def __exit__(self, *exc_info: object) -> None:
        self.halt()

    def fire(self) -> float | None:
        """One tick, on the ticker's thread: seconds until the next, or None to stop."""
        try:
            go_on = self._tick(*self._args)
        except Exception:  # the shared thread must outlive any one tick
            logger.exception("a periodic task failed; stopped")
            go_on = False
        return self._seconds if go_on else None

    def stop(self) -> None:
        """Stop ticking, once a tick in flight has returned (at once from the tick
        itself)."""
        if self._seconds is not None:
            _TICKER.remove(self)


class _Ticker:
    """The one thread that runs the ticks of every `Periodic` (see the module)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # the thread stayed in the parent

    def _reset(self) -> None:
        # Entered by its plain lock (in C) on every block; waited on as a condition.
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        self._due: dict[Periodic, float] = {}
        self._wake_at = math.inf
        self._busy = False
        self._firing: Periodic | None = None
        self._thread: threading.Thread | None = None

    def add(self, periodic: Periodic, seconds: float) -> None:
        due = time.monotonic() + seconds
        with self._mutex:
            self._due[periodic] = due
            self._busy = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="idempotence-ticker")
                self._thread.daemon = True
                self._thread.start()
            elif due < self._wake_at:
                # Only a tick due before the thread wakes wakes it: a wake per block
                # was a context switch per guarded call (~60 µs of CPU).
                self._wake_at = due
                self._lock.notify()

    def remove(self, periodic: Periodic) -> None:
        with self._mutex:
            periodic.stopped = True
            if self._due.pop(periodic, None) is not None:
                return  # not ticking: it never will again
            if self._thread is threading.current_thread():
                return  # the tick stops its own Periodic: nothing to wait for
            while self._firing is periodic:
                self._lock.wait()

    def _run(self) -> None:
        lock = self._lock
        with lock:
            while True:
                now = time.monotonic()
                for periodic in _due(self._due, now):
                    self._firing = periodic
                    lock.release()
                    try:
                        seconds = periodic.fire()
                    finally:
                        lock.acquire()
                        self._firing = None
                    if seconds is not None and not periodic.stopped:
                        self._due[periodic] = time.monotonic() + seconds
                    lock.notify_all()  # a stop() may be waiting for this tick
                now = time.monotonic()
                self._wake_at = _next_wake(self._due, now, self._busy)
                self._busy = False
                lock.wait(None if self._wake_at == math.inf else self._wake_at - now)


_TICKER = _Ticker()


class AsyncPeriodic:
    """While its ``async with`` block runs, call ``tick(*args)`` every ``seconds``,
    until ``tick`` returns False or `stop`; None never ticks.

    Every block of an event loop is ticked by one timer of that loop (see the module);
    each tick runs as a task of its own. The block's end stops it and waits for a tick
    in flight: nothing ticks after it.

    A block can also be begun by `start` and ended by `halt` (and `stop` only when
    ``halt`` says a tick is in flight), with no coroutine of its own when none is:
    ``async with`` makes two per block, a share of a guarded call.
    """

    __slots__ = ("_args", "_name", "_seconds", "_stopped", "_tick", "_ticker", "_ticking")

    def __init__(
        self, name: str, seconds: float | None, tick: Callable[..., Awaitable[bool]], *args: Any
    ) -> None:
        self._name = name
        self._seconds = seconds
        self._tick = tick
        self._args = args
        self._ticker: _LoopTicker | None = None
        self._ticking: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self) -> AsyncPeriodic:
        """Begin the block (``async with`` does)."""
        if self._seconds is not None:
            self._ticker = _loop_ticker()
            self._ticker.add(self, self._seconds)
        return self

    async def __aenter__(self) -> AsyncPeriodic:
        return self.start()

    def halt(self) -> bool:
        """End the block: stop ticking; True when a tick is in flight, which `stop`
        then waits for."""
        self._stopped = True
        if self._ticker is not None:
            self._ticker.remove(self)
        ticking = self._ticking
        return ticking is not None and ticking is not asyncio.current_task()

    def fire(self) -> None:
        """Start one tick, as a task of its own (the ticker calls it when it is due)."""
        if not self._stopped:
            loop = asyncio.get_running_loop()
            self._ticking = loop.create_task(self._run_tick(), name=self._name)

    async def _run_tick(self) -> None:
        try:
            go_on = await self._tick(*self._args)
        except Exception:
            logger.exception("a periodic task failed; stopped")
            go_on = False
        finally:
            self._ticking = None
        if go_on and not self._stopped and self._ticker is not None:
            assert self._seconds is not None
            self._ticker.add(self, self._seconds)

    async def stop(self, *exc_info: object) -> None:
        """Stop ticking, once a tick in flight has returned."""
        self._stopped = True
        if self._ticker is not None:
            self._ticker.remove(self)
        ticking = self._ticking
        if ticking is not None and ticking is not asyncio.current_task():
            await ticking

    # The block's end is stop() itself: a coroutine fewer per guarded call.
    __aexit__ = stop


class _LoopTicker:
    """The one timer of an event loop that starts the ticks of its `AsyncPeriodic`
    blocks (see the module). Used from the loop's own thread only, and holds no
    reference to the loop (which holds it, through its timer)."""

    def __init__(self) -> None:
        self._due: dict[AsyncPeriodic, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._wake_at = math.inf
        self._busy = False

    def add(self, periodic: AsyncPeriodic, seconds: float) -> None:
        due = time.monotonic() + seconds
        self._due[periodic] = due
        self._busy = True
        if due < self._wake_at:
            self._arm(due)

    def remove(self, periodic: AsyncPeriodic) -> None:
        self._due.pop(periodic, None)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._wake_at = at
        delay = max(at - time.monotonic(), 0.0)
        self._timer = asyncio.get_running_loop().call_later(delay, self._wake)

    def _wake(self) -> None:
        self._timer = None
        now = time.monotonic()
        for periodic in _due(self._due, now):
            periodic.fire()
        at = _next_wake(self._due, now, self._busy)
        self._busy = False
        self._wake_at = math.inf
        if at != math.inf:
            self._arm(at)


_LOOP_TICKERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopTicker] = (
    weakref.WeakKeyDictionary()
)
_last: tuple[weakref.ref[asyncio.AbstractEventLoop] | None, _LoopTicker | None] = (None, None)


def _loop_ticker() -> _LoopTicker:
    """The running loop's ticker (the last one found is kept at hand)."""
    global _last
    loop = asyncio.get_running_loop()
    last_loop, ticker = _last
    if last_loop is not None and last_loop() is loop and ticker is not None:
        return ticker
    ticker = _LOOP_TICKERS.get(loop)
    if ticker is None:
        ticker = _LOOP_TICKERS[loop] = _LoopTicker()
    _last = (weakref.ref(loop), ticker)
    return ticker
