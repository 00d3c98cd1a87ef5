"""The few primitives whose sync and async spellings differ by more than a keyword.

The generated sync modules (scripts/unasync.py) use the name without ``_async`` (or
without ``Async``) where their async sources use the other one, so both spellings
live here, side by side, and nowhere else; the periodic ticks (`Periodic`,
`AsyncPeriodic`), larger, are written in `idempotence._periodic` and imported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from ._periodic import AsyncPeriodic, Periodic

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
