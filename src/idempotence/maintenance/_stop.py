"""Stopping a worker on SIGTERM or SIGINT, sync or async (DESIGN 7)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

log = logging.getLogger("idempotence.maintenance.worker")


@contextlib.contextmanager
def stop_on_signals(
    stop: threading.Event | asyncio.Event,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> Iterator[None]:
    """Set ``stop`` on the first of ``signals``; restore the old handlers on exit.

    ``stop`` is the sync worker's `threading.Event` or, entered in a running
    event loop, the async worker's `asyncio.Event` (set through the loop, which
    the handler wakes). A second signal while stopping falls through to the previous
    handler (Ctrl-C twice interrupts at once). Call from the main thread.
    """
    previous: dict[signal.Signals, Any] = {}
    if isinstance(stop, asyncio.Event):
        loop = asyncio.get_running_loop()

        def set_stop() -> None:
            loop.call_soon_threadsafe(stop.set)
    else:
        set_stop = stop.set
    stopping = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        sig = signal.Signals(signum)
        if stopping or stop.is_set():
            old = previous.get(sig)
            if callable(old):
                old(signum, frame)
            return
        stopping = True
        log.info("%s received: stopping after the current batches", sig.name)
        set_stop()

    for sig in signals:
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
