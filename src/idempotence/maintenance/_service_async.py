"""The shape every background service has (DESIGN 7): the batch loop, pauses, the
long-running loop, logging and test signals, on an
[`AsyncStore`][idempotence.testing.harness.AsyncStore].

A service does its work in passes. `AsyncService.run_once` is one pass:
batches of at most ``batch_size`` rows, each in a transaction of its own, until a
batch comes back short (the backlog is worked off), with a short jittered pause
between batches so that a large backlog never starves the requests that share the
database. `AsyncService.run_forever` repeats passes, a jittered ``interval``
apart, until its stop event is set; it survives a failed pass (the database
restarting, say) and tries again at the next interval.

The configuration and the signals, which need no store, are in `_service_shared`, shared
by both flavours (F7).
"""

from __future__ import annotations

import abc
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic

from .._concurrency import AsyncEvent, wait_until_set_async
from ..errors import StoreUnavailable
from ..metrics import Metrics, default_metrics
from ..stores import AsyncStore
from ._service_shared import MAX_NAP, ConfigT, Progress, ResultT, Signals, jittered, log_pass


class AsyncService(abc.ABC, Generic[ConfigT, ResultT]):
    """The shape every maintenance service has (see the module docstring).

    Subclasses implement `_pass`, which drains its work with `_drain`
    and returns the pass's frozen result; `_summary` says what the result
    means, for the log.
    """

    name: ClassVar[str]
    """The service's name in logs, metrics and signals."""

    def __init__(
        self,
        store: AsyncStore,
        config: ConfigT,
        *,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
        sleep: Callable[[float, AsyncEvent], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.signals = signals
        self.metrics = metrics if metrics is not None else default_metrics()
        self.log = logging.getLogger(f"idempotence.maintenance.{self.name}")
        self._random = random.Random()
        # A test hands in a sleep that records the pauses and moves a clock of its own,
        # so that it sees a schedule of minutes in no time.
        self._sleep = sleep if sleep is not None else _sleep_until_stopped

    # -- the public shape ------------------------------------------------------------

    async def run_once(
        self, stop: AsyncEvent | None = None, *, progress: Progress | None = None
    ) -> ResultT:
        """Run one pass and return what it did. ``stop`` ends it between batches."""
        started = time.monotonic()
        try:
            result = await self._pass(stop or AsyncEvent(), progress)
        except Exception:
            self.metrics.pass_failed(self.name)
            raise
        seconds = time.monotonic() - started
        self.metrics.pass_finished(self.name, seconds)
        log_pass(self.log, self.name, seconds, self._summary(result))
        self._emit("pass", result)
        return result

    async def run_forever(self, stop: AsyncEvent) -> None:
        """Run passes until ``stop`` is set; a failed pass is logged and retried at the
        next interval (the service outlives a database restart)."""
        self.log.info("%s started", self.name, extra={"service": self.name})
        while not stop.is_set():
            result: ResultT | None = None
            failure: Exception | None = None
            try:
                result = await self.run_once(stop)
            except Exception as exc:
                failure = exc
            await self._sleep(self._after_pass(result, failure), stop)
        self.log.info("%s stopped", self.name, extra={"service": self.name})
        self._emit("stopped")

    def summary(self, result: ResultT) -> str:
        """One line that says what a pass did (the CLI prints it)."""
        return self._summary(result)[0]

    # -- for subclasses ----------------------------------------------------------------

    @abc.abstractmethod
    async def _pass(self, stop: AsyncEvent, progress: Progress | None) -> ResultT: ...

    @abc.abstractmethod
    def _summary(self, result: ResultT) -> tuple[str, dict[str, Any]]:
        """The log line for a pass and its structured fields (``count``: items done)."""

    def _after_pass(self, result: ResultT | None, failure: Exception | None) -> float:
        """Log how a pass of ``run_forever`` ended (``result``, or the ``failure`` it
        raised) and return the seconds until the next pass: the interval, jittered."""
        if isinstance(failure, StoreUnavailable):
            # The store logs an outage once, as it begins and as it ends: a
            # line (or a traceback) per pass of every service would be noise.
            self.log.debug("%s pass failed: %s", self.name, failure, extra={"service": self.name})
        elif failure is not None:
            # Assume a failing database stays failing for a while: wait the full
            # interval rather than hammering it.
            self.log.error(
                "%s pass failed", self.name, exc_info=failure, extra={"service": self.name}
            )
        return jittered(self._random, self.config.interval, self.config.jitter)

    async def _drain(
        self,
        what: str,
        batch: Callable[[], Awaitable[int]],
        stop: AsyncEvent,
        progress: Progress | None,
    ) -> int:
        """Run ``batch`` (which returns how many rows it handled) until a short page,
        ``max_batches`` or ``stop``; return the number of batches run."""
        batches = done = 0
        limit = self.config.max_batches
        while True:
            handled = await batch()
            batches += 1
            done += handled
            self._emit("batch", (what, handled))
            if progress is not None:
                progress(what, done)
            if handled < self.config.batch_size:
                return batches  # a short page: nothing is left
            if (limit is not None and batches >= limit) or stop.is_set():
                return batches
            await self._sleep(
                jittered(self._random, self.config.batch_pause, self.config.jitter), stop
            )

    def _emit(self, name: str, payload: Any = None) -> None:
        if self.signals is not None:
            self.signals.emit(f"{self.name}.{name}", payload)


async def _sleep_until_stopped(seconds: float, stop: AsyncEvent) -> None:
    """Wait ``seconds``, or until ``stop`` is set."""
    deadline = time.monotonic() + seconds
    while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
        await wait_until_set_async(stop, min(left, MAX_NAP))
