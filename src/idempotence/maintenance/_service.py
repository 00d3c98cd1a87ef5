"""What every background service shares: configuration, the batch loop, pauses, the
long-running loop, logging and test signals (DESIGN 7).

A service does its work in passes. :meth:`Service.run_once` is one pass: batches of
at most ``batch_size`` rows, each in a transaction of its own, until a batch comes
back short (the backlog is worked off), with a short jittered pause between batches
so that a large backlog never starves the requests that share the database.
:meth:`Service.run_forever` repeats passes, a jittered ``interval`` apart, until its
stop event is set; it survives a failed pass (the database restarting, say) and
tries again at the next interval.
"""

from __future__ import annotations

import abc
import logging
import queue
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from ..errors import ConfigurationError
from ..stores import Store
from .metrics import Metrics, default_metrics

ResultT = TypeVar("ResultT")
ConfigT = TypeVar("ConfigT", bound="ServiceConfig")

#: The longest a service sleeps in one go, so that a stop is noticed promptly even if
#: the stop event is never set (a test that only sets a flag).
_MAX_NAP = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceConfig:
    """Settings every service has; each service's config adds its own and changes the
    defaults. Invalid values raise :class:`~idempotence.ConfigurationError` at once.

    >>> SweeperConfig(batch_size=500, interval=10.0)          # doctest: +SKIP
    """

    #: Rows per batch (and per transaction).
    batch_size: int = 100
    #: Seconds between two passes of :meth:`Service.run_forever`.
    interval: float = 60.0
    #: Seconds between two batches of one pass.
    batch_pause: float = 0.05
    #: Each pause is stretched or shrunk by up to this fraction, at random, so that
    #: services started together on many nodes drift apart instead of colliding.
    jitter: float = 0.25
    #: Seconds one statement may run (PostgreSQL ``statement_timeout``); None for no
    #: limit.
    query_timeout: float | None = 30.0
    #: Batches one pass runs at most; None works the backlog off.
    max_batches: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` for a value that cannot work."""
        _positive(self, "batch_size", self.batch_size)
        _positive(self, "interval", self.interval)
        if self.batch_pause < 0:
            raise _invalid(self, "batch_pause", self.batch_pause, "must not be negative")
        if not 0 <= self.jitter < 1:
            raise _invalid(self, "jitter", self.jitter, "must be in [0, 1)")
        if self.query_timeout is not None:
            _positive(self, "query_timeout", self.query_timeout)
        if self.max_batches is not None:
            _positive(self, "max_batches", self.max_batches)


def _invalid(config: object, field: str, value: object, why: str) -> ConfigurationError:
    return ConfigurationError(f"{type(config).__name__}.{field}={value!r}: {why}")


def _positive(config: object, field: str, value: float) -> None:
    if not value > 0:
        raise _invalid(config, field, value, "must be positive")


class Signals:
    """Named events a service emits as it works, so a test can wait for one instead
    of sleeping, or act at a precise moment (River's test signals).

    ``on(name, fn)`` runs ``fn(payload)`` in the service's thread when ``name`` is
    emitted (while a batch's transaction is open, for ``batch_locked``), and every
    event is queued for :meth:`wait`.

    >>> signals = Signals()
    >>> signals.emit("pass", 3)
    >>> signals.wait("pass")
    3
    """

    def __init__(self) -> None:
        self._queues: defaultdict[str, queue.Queue[Any]] = defaultdict(queue.Queue)
        self._hooks: defaultdict[str, list[Callable[[Any], None]]] = defaultdict(list)
        self._lock = threading.Lock()

    def on(self, name: str, fn: Callable[[Any], None]) -> None:
        with self._lock:
            self._hooks[name].append(fn)

    def emit(self, name: str, payload: Any = None) -> None:
        with self._lock:
            hooks = list(self._hooks[name])
            events = self._queues[name]
        for hook in hooks:
            hook(payload)
        events.put(payload)

    def wait(self, name: str, timeout: float = 10.0) -> Any:
        """The payload of the next ``name`` event; TimeoutError if none comes in time."""
        with self._lock:
            events = self._queues[name]
        try:
            return events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no {name!r} signal within {timeout}s") from None


Progress = Callable[[str, int], None]
"""Told ``(what, how many so far)`` after each batch: the CLI's progress line."""


class Service(abc.ABC, Generic[ConfigT, ResultT]):
    """The shape every maintenance service has (see the module docstring).

    Subclasses implement :meth:`_pass`, which drains its work with :meth:`_drain`
    and returns the pass's frozen result; :meth:`_summary` says what the result
    means, for the log.
    """

    #: The service's name in logs, metrics and signals.
    name: ClassVar[str]

    def __init__(
        self,
        store: Store,
        config: ConfigT,
        *,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.signals = signals
        self.metrics = metrics if metrics is not None else default_metrics()
        self.log = logging.getLogger(f"idempotence.maintenance.{self.name}")
        self._random = random.Random()

    # -- the public shape ------------------------------------------------------------

    def run_once(
        self, stop: threading.Event | None = None, *, progress: Progress | None = None
    ) -> ResultT:
        """Run one pass and return what it did. ``stop`` ends it between batches."""
        started = time.monotonic()
        try:
            result = self._pass(stop or threading.Event(), progress)
        except Exception:
            self.metrics.pass_failed(self.name)
            raise
        seconds = time.monotonic() - started
        self.metrics.pass_finished(self.name, seconds)
        message, fields = self._summary(result)
        level = logging.INFO if fields.get("count", 1) else logging.DEBUG
        self.log.log(level, message, extra={"service": self.name, "seconds": seconds, **fields})
        self._emit("pass", result)
        return result

    def run_forever(self, stop: threading.Event) -> None:
        """Run passes until ``stop`` is set; a failed pass is logged and retried at the
        next interval (the service outlives a database restart)."""
        self.log.info("%s started", self.name, extra={"service": self.name})
        while not stop.is_set():
            try:
                self.run_once(stop)
            except Exception:
                # Assume a failing database stays failing for a while: wait the full
                # interval rather than hammering it.
                self.log.exception("%s pass failed", self.name, extra={"service": self.name})
            self._sleep(self.config.interval, stop)
        self.log.info("%s stopped", self.name, extra={"service": self.name})
        self._emit("stopped")

    def summary(self, result: ResultT) -> str:
        """One line that says what a pass did (the CLI prints it)."""
        return self._summary(result)[0]

    # -- for subclasses ----------------------------------------------------------------

    @abc.abstractmethod
    def _pass(self, stop: threading.Event, progress: Progress | None) -> ResultT: ...

    @abc.abstractmethod
    def _summary(self, result: ResultT) -> tuple[str, dict[str, Any]]:
        """The log line for a pass and its structured fields (``count``: items done)."""

    def _drain(
        self,
        what: str,
        batch: Callable[[], int],
        stop: threading.Event,
        progress: Progress | None,
    ) -> int:
        """Run ``batch`` (which returns how many rows it handled) until a short page,
        ``max_batches`` or ``stop``; return the number of batches run."""
        batches = done = 0
        limit = self.config.max_batches
        while True:
            handled = batch()
            batches += 1
            done += handled
            self._emit("batch", (what, handled))
            if progress is not None:
                progress(what, done)
            if handled < self.config.batch_size:
                return batches  # a short page: nothing is left
            if (limit is not None and batches >= limit) or stop.is_set():
                return batches
            self._sleep(self.config.batch_pause, stop)

    def _emit(self, name: str, payload: Any = None) -> None:
        if self.signals is not None:
            self.signals.emit(f"{self.name}.{name}", payload)

    def _sleep(self, seconds: float, stop: threading.Event) -> None:
        jitter = self.config.jitter
        deadline = time.monotonic() + seconds * self._random.uniform(1 - jitter, 1 + jitter)
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            stop.wait(min(left, _MAX_NAP))
