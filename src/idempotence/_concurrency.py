"""The few primitives whose sync and async spellings differ by more than a keyword.

The generated sync modules (scripts/unasync.py) use the name without ``_async`` (or
without ``Async``) where their async sources use the other one, so both spellings
live here, side by side, and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

__all__ = [
    "AsyncEvent",
    "AsyncLock",
    "Event",
    "Lock",
    "run_until_stopped",
    "run_until_stopped_async",
    "sleep",
    "sleep_async",
    "wait_until_set",
    "wait_until_set_async",
]

#: A mutual exclusion between tasks (async) or threads (sync).
AsyncLock = asyncio.Lock
Lock = threading.Lock

#: A flag that tasks (async) or threads (sync) wait on: a background service's stop.
AsyncEvent = asyncio.Event
Event = threading.Event


async def sleep_async(seconds: float) -> None:
    """Pause the task for ``seconds``."""
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    """Pause the thread for ``seconds``."""
    time.sleep(seconds)


async def wait_until_set_async(event: asyncio.Event, seconds: float) -> bool:
    """Wait at most ``seconds`` for ``event``; whether it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


def wait_until_set(event: threading.Event, seconds: float) -> bool:
    """Wait at most ``seconds`` for ``event``; whether it is set."""
    return event.wait(seconds)


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
