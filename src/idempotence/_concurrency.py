"""The few primitives whose sync and async spellings differ by more than a keyword.

The generated sync modules (scripts/unasync.py) use the name without ``_async`` (or
without ``Async``) where their async sources use the other one, so both spellings
live here, side by side, and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = [
    "AsyncBackground",
    "AsyncEvent",
    "AsyncLock",
    "AsyncPeriodic",
    "AsyncWakeup",
    "Background",
    "Event",
    "Lock",
    "Periodic",
    "Wakeup",
    "acquire",
    "acquire_async",
    "call_blocking",
    "call_blocking_async",
    "run_until_stopped",
    "run_until_stopped_async",
    "sleep",
    "sleep_async",
    "wait_until_set",
    "wait_until_set_async",
]

AsyncLock = asyncio.Lock
"""A mutual exclusion between tasks (async) or threads (sync)."""
Lock = threading.Lock

AsyncEvent = asyncio.Event
"""A flag that tasks (async) or threads (sync) wait on: a background service's stop."""
Event = threading.Event

T = TypeVar("T")


async def sleep_async(seconds: float) -> None:
    """Pause the task for ``seconds``."""
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    """Pause the thread for ``seconds``."""
    time.sleep(seconds)


async def call_blocking_async(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` for a library with no asyncio API (its I/O blocks), on a worker
    thread so that the event loop runs on meanwhile."""
    return await asyncio.to_thread(fn, *args)


def call_blocking(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, on the calling thread (a sync caller may block)."""
    return fn(*args)


_SPAWNED: set[asyncio.Task[Any]] = set()


def spawn_async(fn: Callable[[], Awaitable[Any]], name: str) -> None:
    """Run ``fn()`` in a task of its own on the running loop, not awaited: the
    request that started it has answered already (HTTP asynchronous acceptance).
    An exception is logged; the task is kept referenced until it ends."""

    async def run() -> None:
        try:
            await fn()
        except Exception:
            logging.getLogger("idempotence").exception("background task %s failed", name)

    task = asyncio.get_running_loop().create_task(run(), name=name)
    _SPAWNED.add(task)
    task.add_done_callback(_SPAWNED.discard)


def spawn(fn: Callable[[], Any], name: str) -> None:
    """Run ``fn()`` in a daemon thread of its own; an exception is logged."""

    def run() -> None:
        try:
            fn()
        except Exception:
            logging.getLogger("idempotence").exception("background task %s failed", name)

    threading.Thread(target=run, name=name, daemon=True).start()


class AsyncWakeup:
    """Woken from any thread or event loop; waited for by one task of the loop it was
    made on."""

    __slots__ = ("_future", "_loop")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future[None] = self._loop.create_future()

    def set(self) -> None:
        # The waker may run on another loop or thread than the waiter.
        with contextlib.suppress(RuntimeError):  # the waiter's loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    async def wait(self, seconds: float) -> None:
        """Return when woken, or after ``seconds``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._future), seconds)


class Wakeup:
    """Woken from any thread; waited for by one thread."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def wait(self, seconds: float) -> None:
        self._event.wait(seconds)


AsyncJob = Callable[[Callable[[bool], None]], Coroutine[Any, Any, None]]
"""A long-running job (see `AsyncBackground`), handed the callback with which
it reports once whether it came up."""
Job = Callable[[Callable[[bool], None]], None]


class AsyncBackground:
    """One long-running job of an object's, started when first needed and again after
    it ended: a task on the loop of whoever needs it (and moved to another loop if
    that one is gone). The job reads `stopping` to know when to end."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[bool] | None = None
        self.stopping = False

    async def ensure(self, job: AsyncJob) -> bool:
        """Make sure the job runs, starting ``job`` if it does not; return what it
        reported: True once it is up, False if it failed to come up."""
        if self.stopping:
            return False
        loop = asyncio.get_running_loop()
        task = self._task
        if task is None or task.done() or task.get_loop() is not loop:
            if task is not None and not task.done():
                _cancel(task)  # it runs on a loop other than this one
            self._ready = ready = loop.create_future()
            self._task = loop.create_task(job(functools.partial(_report, ready)), name=self._name)
        assert self._ready is not None
        # Shielded: a caller given up on must not cancel the start others wait for.
        return await asyncio.shield(self._ready)

    async def stop(self, grace: float) -> None:
        """End the job (for good), waiting up to ``grace`` seconds for it."""
        self.stopping = True
        task, self._task = self._task, None
        if task is None or task.done():
            return
        if task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            await asyncio.wait([task], timeout=grace)
        else:
            _cancel(task)


class Background:
    """One long-running job of an object's, on a daemon thread of its own, started
    when first needed and again after it ended. The job reads `stopping` to
    know when to end (a thread cannot be interrupted)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ready: Future[bool] = Future()
        self.stopping = False

    def ensure(self, job: Job) -> bool:
        """Make sure the job runs, starting ``job`` if it does not; return what it
        reported: True once it is up, False if it failed to come up."""
        with self._lock:
            if self.stopping:
                return False
            if self._thread is None or not self._thread.is_alive():
                ready: Future[bool] = Future()
                self._ready = ready
                report = functools.partial(_report, ready)
                self._thread = threading.Thread(
                    target=job, args=(report,), name=self._name, daemon=True
                )
                self._thread.start()
            ready = self._ready
        return ready.result()

    def stop(self, grace: float) -> None:
        """End the job (for good), waiting up to ``grace`` seconds for it."""
        with self._lock:
            self.stopping = True
            thread = self._thread
        if thread is not None:
            thread.join(grace)


class AsyncPeriodic:
    """While its ``async with`` block runs, call ``tick()`` every ``seconds``, until
    ``tick`` returns False or `stop`; None never ticks.

    Between ticks it is only a timer of the event loop (a task started per block cost
    about 12 µs of CPU, per guarded request); each tick runs as a task of its own. The
    block's end stops it and waits for a tick in flight: nothing ticks after it.
    """

    def __init__(
        self, name: str, seconds: float | None, tick: Callable[[], Awaitable[bool]]
    ) -> None:
        self._name = name
        self._seconds = seconds
        self._tick = tick
        self._timer: asyncio.TimerHandle | None = None
        self._ticking: asyncio.Task[None] | None = None
        self._stopped = False

    async def __aenter__(self) -> AsyncPeriodic:
        if self._seconds is not None:
            self._arm()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _arm(self) -> None:
        assert self._seconds is not None
        self._timer = asyncio.get_running_loop().call_later(self._seconds, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if not self._stopped:
            loop = asyncio.get_running_loop()
            self._ticking = loop.create_task(self._run_tick(), name=self._name)

    async def _run_tick(self) -> None:
        try:
            go_on = await self._tick()
        except Exception:
            logging.getLogger("idempotence").exception("a periodic task failed; stopped")
            go_on = False
        finally:
            self._ticking = None
        if go_on and not self._stopped:
            self._arm()

    async def stop(self) -> None:
        """Stop ticking, once a tick in flight has returned."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        ticking = self._ticking
        if ticking is not None and ticking is not asyncio.current_task():
            await ticking


class Periodic:
    """While its ``with`` block runs, call ``tick()`` every ``seconds``, until ``tick``
    returns False or `stop`; None never ticks.

    The ticks of every ``Periodic`` run on one daemon thread of the process (see
    `_Ticker`): a thread started per block cost about 120 µs of CPU, a tenth of
    a guarded request. The block's end stops it and waits for a tick in flight: nothing
    ticks after it.
    """

    def __init__(self, name: str, seconds: float | None, tick: Callable[[], bool]) -> None:
        self._seconds = seconds
        self._tick = tick
        # Held while a tick runs, so that stop() waits for it; re-entrant, so that a
        # tick may stop its own Periodic.
        self._lock = threading.RLock()
        self._stopped = False

    def __enter__(self) -> Periodic:
        if self._seconds is not None:
            _TICKER.schedule(self, self._seconds)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def fire(self) -> None:
        """One tick, on the ticker's thread; schedules the next unless told to stop."""
        with self._lock:
            if self._stopped:
                return
            try:
                go_on = self._tick()
            except Exception:  # the shared thread must outlive any one tick
                logging.getLogger("idempotence").exception("a periodic task failed; stopped")
                go_on = False
            if not go_on:
                self._stopped = True
                return
        assert self._seconds is not None
        _TICKER.schedule(self, self._seconds)

    def stop(self) -> None:
        """Stop ticking, once a tick in flight has returned."""
        with self._lock:
            self._stopped = True


class _Ticker:
    """The one thread that runs the ticks of every `Periodic`, in time order.

    A stopped ``Periodic`` stays in the queue until its time comes and is then
    skipped: cheaper than removing it, and bounded by one entry per block per interval.
    """

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._due: list[tuple[float, int, Periodic]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, periodic: Periodic, seconds: float) -> None:
        with self._wake:
            heapq.heappush(self._due, (time.monotonic() + seconds, next(self._order), periodic))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="idempotence-ticker")
                self._thread.daemon = True
                self._thread.start()
            # Wake the ticker only when this tick is due before every other: otherwise
            # it already sleeps until an earlier one, and will see this one then. A
            # wake per guarded call was a context switch per call (~60 us of CPU).
            if self._due[0][2] is periodic:
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(self._due[0][0] - time.monotonic() if self._due else None)
                periodic = heapq.heappop(self._due)[2]
            periodic.fire()


_TICKER = _Ticker()


def _report(ready: asyncio.Future[bool] | Future[bool], up: bool) -> None:
    # Only the job reports, and only its first report counts.
    if not ready.done():
        ready.set_result(up)


def _cancel(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(RuntimeError):  # its loop is closed: the task is gone
        task.get_loop().call_soon_threadsafe(task.cancel)


async def wait_until_set_async(event: asyncio.Event, seconds: float) -> bool:
    """Wait at most ``seconds`` for ``event``; whether it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


def wait_until_set(event: threading.Event, seconds: float) -> bool:
    """Wait at most ``seconds`` for ``event``; whether it is set."""
    return event.wait(seconds)


async def acquire_async(lock: asyncio.Lock, seconds: float) -> bool:
    """Take ``lock``, waiting at most ``seconds``; whether it was taken. Waiters take
    it in the order they came."""
    if not lock.locked():
        # At once (or behind the waiter it was just handed to): no timer to arm.
        await lock.acquire()
        return True
    try:
        async with asyncio.timeout(seconds):
            await lock.acquire()
    except TimeoutError:
        return False
    return True


def acquire(lock: threading.Lock, seconds: float) -> bool:
    """Take ``lock``, waiting at most ``seconds``; whether it was taken (the order
    in which waiting threads take it is the OS's)."""
    return lock.acquire(timeout=max(seconds, 0.0))


async def run_until_stopped_async(
    calls: Sequence[Callable[[], Coroutine[Any, Any, None]]],
    names: Sequence[str],
    stop: asyncio.Event,
) -> None:
    """Run ``calls`` at once, each as a task named by ``names``, until they return
    (they watch ``stop``); set ``stop`` if this is cancelled or one of them fails."""
    try:
        async with asyncio.TaskGroup() as tasks:
            for call, name in zip(calls, names, strict=True):
                tasks.create_task(call(), name=name)
    finally:
        stop.set()


def run_until_stopped(
    calls: Sequence[Callable[[], None]], names: Sequence[str], stop: threading.Event
) -> None:
    """Run ``calls`` at once, each on a thread named by ``names``, until ``stop`` is
    set; then wait for them to return (they watch ``stop``)."""
    threads = [
        threading.Thread(target=call, name=name) for call, name in zip(calls, names, strict=True)
    ]
    for thread in threads:
        thread.start()
    try:
        # Wait on the event, not on join(): the main thread must stay free to run the
        # signal handlers that set it.
        while not stop.wait(0.5):
            pass
    finally:
        stop.set()
        for thread in threads:
            thread.join()
