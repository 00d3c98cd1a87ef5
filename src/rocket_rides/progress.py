"""The demo's progress on stderr: a bar on a terminal, a line every few seconds
otherwise (a CI log, a pipe), so that a long run never looks hung.

The clock starts when the clients do (`Progress.begin`), not when the command
does: the services' start-up is no ride's time, and counted in it the first estimate
of the time left was far too high.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import click

EVERY = 5.0
"""Seconds between two progress lines when stderr is not a terminal."""


class Progress:
    """Told as the clients begin and as each ride ends; see the module docstring."""

    def __init__(
        self,
        total: int,
        *,
        tty: bool,
        write: Callable[[str], None],
        every: float = EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.done = 0
        self._tty = tty
        self._write = write
        self._every = every
        self._clock = clock
        self._began: float | None = None
        self._said = 0.0
        self._bar: Any = None

    def begin(self) -> None:
        """The services are up and the clients start booking."""
        self._began = self._said = self._clock()
        if self._tty:
            self._bar = click.progressbar(length=self.total, label="booking rides", file=sys.stderr)
            self._bar.__enter__()
        else:
            self._write(f"booking {self.total} rides")

    def __call__(self) -> None:
        """A ride ended."""
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
            return
        now = self._clock()
        if self.done == self.total or now - self._said >= self._every:
            self._said = now
            self._write(self.line(now))

    def line(self, now: float) -> str:
        began = now if self._began is None else self._began
        elapsed = now - began
        text = f"booked {self.done}/{self.total} rides in {elapsed:.0f} s"
        left = self.left(now)
        return (
            text if left is None or self.done == self.total else f"{text}, about {left:.0f} s left"
        )

    def left(self, now: float) -> float | None:
        """Seconds left at the pace so far (None before the first ride ends)."""
        if self._began is None or self.done == 0:
            return None
        return (now - self._began) / self.done * (self.total - self.done)

    def end(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
