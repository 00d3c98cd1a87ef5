"""The reaper's retentions, stored 408, settings, result and log lines (B3), shared by
[`AsyncReaper`][idempotence.maintenance.worker_async.AsyncReaper] and the generated
[`Reaper`][idempotence.maintenance.worker.Reaper]."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..problems import Problem, ProblemDetails
from ._ops import ExpiredKey
from ._service_shared import ServiceConfig


class Retention:
    """The usual retentions, for ``Flow(retention=...)``.

    ```python
    from idempotence.flows import Flow
    ledger = Flow("ledger_entries", retention=Retention.FOREVER)
    ```
    """

    DAY: timedelta = timedelta(hours=24)
    """Stripe's window: a day of replays (the default)."""
    THREE_DAYS: timedelta = timedelta(hours=72)
    """Clients that retry over a weekend."""
    WEEK: timedelta = timedelta(days=7)
    FOREVER: None = None
    """Never reaped: the key row is part of a ledger."""


EXPIRED_RESPONSE = ProblemDetails.of(
    Problem.REQUEST_EXPIRED,
    "The request was not completed before its Idempotency-Key expired, and it will not "
    "be completed. Check whether its effects happened before sending it again with a "
    "new Idempotency-Key.",
).stored()
"""What a key that expired before it finished answers to every retry."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaperConfig(ServiceConfig):
    """The reaper's settings; see
    [`ServiceConfig`][idempotence.maintenance.ServiceConfig]. Deleting is cheap per row,
    so its batches are large; the pause between them lets requests through."""

    batch_size: int = 1000
    interval: float = 300.0


@dataclass(frozen=True, slots=True)
class ReapResult:
    """What one pass of the reaper did."""

    expired: tuple[ExpiredKey, ...]
    """Pending keys finished with the stored 408."""
    deleted: int
    """Finished keys deleted."""
    batches: int
    seconds: float


def log_expired(log: logging.Logger, service: str, key: ExpiredKey) -> None:
    log.warning(
        "key %r in scope %r (flow %r) expired unfinished: stored a 408",
        key.key,
        key.scope,
        key.flow,
        extra={"service": service, "scope": key.scope, "key": key.key, "flow": key.flow},
    )


def reap_summary(result: ReapResult) -> tuple[str, dict[str, Any]]:
    return (
        f"deleted {result.deleted} expired key(s), expired {len(result.expired)} "
        f"unfinished key(s) with a 408, in {result.batches} batch(es)",
        {
            "count": result.deleted + len(result.expired),
            "deleted": result.deleted,
            "expired": len(result.expired),
            "batches": result.batches,
        },
    )
