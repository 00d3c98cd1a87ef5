"""The enqueuer's settings and result (B4), shared by
[`AsyncEnqueuer`][idempotence.maintenance.worker_async.AsyncEnqueuer] and the generated
[`Enqueuer`][idempotence.maintenance.worker.Enqueuer]."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._service_shared import ServiceConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueuerConfig(ServiceConfig):
    """The enqueuer's settings; see
    [`ServiceConfig`][idempotence.maintenance.ServiceConfig]. Jobs wait for it, so it
    runs often."""

    interval: float = 1.0


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
