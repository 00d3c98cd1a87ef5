"""The sweeper's settings, its result and its log lines (B1), shared by
[`AsyncSweeper`][idempotence.maintenance.worker_async.AsyncSweeper] and the generated
[`Sweeper`][idempotence.maintenance.worker.Sweeper]."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ._ops import SweptKey
from ._service_shared import ServiceConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class SweeperConfig(ServiceConfig):
    """The sweeper's settings; see [`ServiceConfig`][idempotence.maintenance.ServiceConfig]."""

    interval: float = 30.0


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one pass of the sweeper did."""

    swept: tuple[SweptKey, ...]
    """The keys unlocked, with their new fencing tokens."""
    batches: int
    seconds: float

    @property
    def count(self) -> int:
        return len(self.swept)


def log_swept(log: logging.Logger, service: str, key: SweptKey) -> None:
    """One line per key: a crash signal an operator may want to trace."""
    log.warning(
        "released the expired lock of key %r in scope %r (flow %r, at %r)",
        key.key,
        key.scope,
        key.flow,
        key.recovery_point,
        extra={
            "service": service,
            "scope": key.scope,
            "key": key.key,
            "flow": key.flow,
            "recovery_point": key.recovery_point,
            "lock_token": key.lock_token,
        },
    )


def sweep_summary(result: SweepResult) -> tuple[str, dict[str, Any]]:
    return (
        f"swept {result.count} expired lock(s) in {result.batches} batch(es)",
        {"count": result.count, "batches": result.batches},
    )
