"""Waiting for something another thread, task or process does: the one polling loop
of the suites, bounded by a deadline (a test never sleeps a fixed time hoping it is
enough), failing with what never happened."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

#: Long enough for a loaded CI machine; a condition that holds returns at once.
DEFAULT_TIMEOUT = 10.0


def eventually(
    check: Callable[[], object],
    what: str | Callable[[], str] = "",
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.01,
) -> None:
    """Return as soon as ``check()`` is true; fail the test after ``timeout`` seconds
    saying ``what`` never happened (a callable: built then, e.g. from a log)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting until {_said(what, check)}")
        time.sleep(interval)


async def eventually_async(
    check: Callable[[], object],
    what: str | Callable[[], str] = "",
    *,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - a deadline, as eventually() has
    interval: float = 0.001,
) -> None:
    """:func:`eventually` in a task: the event loop runs while it waits."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting until {_said(what, check)}")
        await asyncio.sleep(interval)


def _said(what: str | Callable[[], str], check: Callable[[], object]) -> str:
    if callable(what):
        return what()
    return what or repr(check)
