"""The few primitives whose sync and async spellings differ by more than a keyword.

The generated sync modules (scripts/unasync.py) use the name without ``_async`` (or
without ``Async``) where their async sources use the other one, so both spellings
live here, side by side, and nowhere else.
"""

from __future__ import annotations

import asyncio
import threading
import time

__all__ = ["AsyncLock", "Lock", "sleep", "sleep_async"]

#: A mutual exclusion between tasks (async) or threads (sync).
AsyncLock = asyncio.Lock
Lock = threading.Lock


async def sleep_async(seconds: float) -> None:
    """Pause the task for ``seconds``."""
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    """Pause the thread for ``seconds``."""
    time.sleep(seconds)
