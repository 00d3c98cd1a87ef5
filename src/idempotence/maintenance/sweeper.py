"""The sweeper (B1): release locks whose holder stopped renewing them.

A lock older than its key's own ``lock_timeout`` means the worker that held it
crashed, hung or lost its network. The sweeper unlocks the key and bumps its fencing
token, so that if the holder was only paused (GC, SIGSTOP, a partition) its late
checkpoint is refused (F1) rather than committed over the next worker's. Each key it
releases is a crash signal: logged with its scope, key and flow, and counted.

Claims take over expired locks by themselves (P5); the sweeper makes the state
observable (a key shows ``pending`` instead of a stale ``processing``) and hands the
key to the completer (B2) without waiting for a client's retry.

>>> sweeper = Sweeper(store)                       # doctest: +SKIP
>>> sweeper.run_once()                             # doctest: +SKIP
SweepResult(swept=(...), batches=1, seconds=0.004)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from ..stores import Store
from . import _ops
from ._ops import SweptKey
from ._service import Progress, Service, ServiceConfig, Signals
from .metrics import Metrics


@dataclass(frozen=True, slots=True, kw_only=True)
class SweeperConfig(ServiceConfig):
    """The sweeper's settings; see :class:`ServiceConfig`."""

    interval: float = 30.0


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one pass of the sweeper did."""

    #: The keys unlocked, with their new fencing tokens.
    swept: tuple[SweptKey, ...]
    batches: int
    seconds: float

    @property
    def count(self) -> int:
        return len(self.swept)


class Sweeper(Service[SweeperConfig, SweepResult]):
    """Releases expired locks in batches (B1); see the module docstring."""

    name = "sweeper"

    def __init__(
        self,
        store: Store,
        config: SweeperConfig | None = None,
        *,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(store, config or SweeperConfig(), signals=signals, metrics=metrics)

    def _pass(self, stop: threading.Event, progress: Progress | None) -> SweepResult:
        started = time.monotonic()
        swept: list[SweptKey] = []

        def batch() -> int:
            found = self.store.perform(
                lambda: _ops.sweep(
                    self.store.dialect, self.config.batch_size, self.config.query_timeout
                )
            )
            for key in found:
                # One line per key: a crash signal an operator may want to trace.
                self.log.warning(
                    "released the expired lock of key %r in scope %r (flow %r, at %r)",
                    key.key,
                    key.scope,
                    key.flow,
                    key.recovery_point,
                    extra={
                        "service": self.name,
                        "scope": key.scope,
                        "key": key.key,
                        "flow": key.flow,
                        "recovery_point": key.recovery_point,
                        "lock_token": key.lock_token,
                    },
                )
            self.metrics.keys_swept(len(found))
            swept.extend(found)
            return len(found)

        batches = self._drain("swept", batch, stop, progress)
        return SweepResult(tuple(swept), batches, time.monotonic() - started)

    def _summary(self, result: SweepResult) -> tuple[str, dict[str, Any]]:
        return (
            f"swept {result.count} expired lock(s) in {result.batches} batch(es)",
            {"count": result.count, "batches": result.batches},
        )
