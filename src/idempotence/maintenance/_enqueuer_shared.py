"""The enqueuer's settings, result and backoff (B4), shared by
[`AsyncEnqueuer`][idempotence.maintenance.worker_async.AsyncEnqueuer] and the generated
[`Enqueuer`][idempotence.maintenance.worker.Enqueuer]."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ._service_shared import ServiceConfig, _invalid, _positive, jittered


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueuerConfig(ServiceConfig):
    """The enqueuer's settings; see
    [`ServiceConfig`][idempotence.maintenance.ServiceConfig]. Jobs wait for it, so it
    runs often."""

    interval: float = 1.0
    sink_backoff: float = 0.5
    """Seconds before the first new attempt after the sink failed to deliver (the
    broker down, refusing or not confirming); each failure in a row doubles the wait,
    up to ``sink_max_backoff``. A delivery resets it."""
    sink_max_backoff: float = 30.0
    """The longest wait between two attempts while the sink keeps failing."""

    def validate(self) -> None:
        ServiceConfig.validate(self)
        _positive(self, "sink_backoff", self.sink_backoff)
        if not self.sink_max_backoff >= self.sink_backoff:
            raise _invalid(
                self, "sink_max_backoff", self.sink_max_backoff, "must be at least sink_backoff"
            )


class SinkBackoff:
    """How long the enqueuer waits after a failed delivery: ``sink_backoff`` after the
    first failure, twice as long after each further one in a row, never longer than
    ``sink_max_backoff``; each wait jittered by the config's ``jitter``, so that the
    enqueuers of many nodes do not knock on the returning broker together."""

    def __init__(self, config: EnqueuerConfig, rng: random.Random) -> None:
        self._config = config
        self._random = rng
        self.failures = 0
        """Failed deliveries in a row."""

    def failed(self) -> float:
        """One more failure: the seconds to wait before the next attempt."""
        cfg = self._config
        self.failures += 1
        # The exponent is capped so that a long outage cannot overflow the float.
        base = min(cfg.sink_backoff * 2.0 ** min(self.failures - 1, 64), cfg.sink_max_backoff)
        return min(jittered(self._random, base, cfg.jitter), cfg.sink_max_backoff)

    def succeeded(self) -> int:
        """The sink delivered: start again from ``sink_backoff``; the failures there were."""
        failures, self.failures = self.failures, 0
        return failures


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What one pass of the enqueuer did."""

    delivered: tuple[str, ...]
    """Job keys delivered for the first time, in staging order."""
    duplicates: int
    """Staged jobs the sink already had (their job_key was delivered before)."""
    batches: int
    seconds: float


def enqueue_summary(result: EnqueueResult) -> tuple[str, dict[str, Any]]:
    n = len(result.delivered)
    return (
        f"delivered {n} staged job(s) ({result.duplicates} duplicate(s)) "
        f"in {result.batches} batch(es)",
        {
            "count": n + result.duplicates,
            "duplicates": result.duplicates,
            "batches": result.batches,
        },
    )
