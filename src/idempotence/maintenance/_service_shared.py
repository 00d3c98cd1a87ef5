"""What the sync and async background services share, without I/O (DESIGN 7, F7):
their configuration, test signals and the arithmetic of their pauses.

The services themselves are written once, async (`_service_async` and the
``*_async`` modules beside it), and their sync twins are generated from them by
``scripts/unasync.py``; everything that needs no store lives here, or in each
service's own shared module (`_sweeper_shared`, `_reaper_shared`,
`_completer_shared`, `_enqueuer_shared`, `_jobs_shared`), so it is
defined once.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ConfigurationError

__all__ = ["MAX_NAP", "Progress", "ServiceConfig", "Signals", "jittered", "log_pass"]

ResultT = TypeVar("ResultT")
ConfigT = TypeVar("ConfigT", bound="ServiceConfig")

MAX_NAP = 1.0
"""The longest a service sleeps in one go, so that a stop is noticed promptly even if
the stop event is never set (a test that only sets a flag)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceConfig:
    """Settings every service has; each service's config adds its own and changes the
    defaults. Invalid values raise
    [`ConfigurationError`][idempotence.maintenance.completer_async.ConfigurationError]
    at once.

    ```python
    SweeperConfig(batch_size=500, interval=10.0)
    ```
    """

    batch_size: int = 100
    """Rows per batch (and per transaction)."""
    interval: float = 60.0
    """Seconds between two passes of ``run_forever``."""
    batch_pause: float = 0.05
    """Seconds between two batches of one pass."""
    jitter: float = 0.25
    """Each pause is stretched or shrunk by up to this fraction, at random, so that
    services started together on many nodes drift apart instead of colliding."""
    query_timeout: float | None = 30.0
    """Seconds one statement may run (PostgreSQL ``statement_timeout``); None for no
    limit."""
    max_batches: int | None = None
    """Batches one pass runs at most; None works the backlog off."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise
        [`ConfigurationError`][idempotence.maintenance.completer_async.ConfigurationError]
        for a value that cannot work."""
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


def jittered(rng: random.Random, seconds: float, jitter: float) -> float:
    """``seconds``, stretched or shrunk at random by up to the fraction ``jitter``."""
    return seconds * rng.uniform(1 - jitter, 1 + jitter)


def log_pass(
    log: logging.Logger, service: str, seconds: float, summary: tuple[str, dict[str, Any]]
) -> None:
    """Log what a pass did: at INFO when it did something, else at DEBUG."""
    message, fields = summary
    level = logging.INFO if fields.get("count", 1) else logging.DEBUG
    log.log(level, message, extra={"service": service, "seconds": seconds, **fields})


class Signals:
    """Named events a service emits as it works, so a test can wait for one instead
    of sleeping, or act at a precise moment (River's test signals).

    ``on(name, fn)`` runs ``fn(payload)`` where the service runs (its thread, or for
    an async service its event loop) when ``name`` is emitted (while a batch's
    transaction is open, for ``batch_locked``), and every event is queued for
    [`wait`][idempotence.maintenance.Signals.wait], which any thread may call.

    ```python
    signals = Signals()
    signals.emit("pass", 3)
    signals.wait("pass")
    # 3
    ```
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
