"""Testing tools for flows: a fake payment provider and the crash-injection harness (F4).

* [`FakeProvider`][idempotence.testing.provider.FakeProvider]: a payment provider with
  its own durable store, Stripe-like idempotency keys, declines, injectable faults, and
  commit hooks.
* [`crash_test`][idempotence.testing.harness.crash_test]: run a flow in child processes,
  SIGKILL it at every boundary, recover by retry and by resume, and assert exactly-once
  effects (`idempotence.testing.harness`).
* [`History`][idempotence.testing.history.History]: record every client attempt and side
  effect of a run under faults (partitions, failovers) and check that nothing ran twice
  and every acknowledged answer is replayed (`idempotence.testing.history`).
* `idempotence.testing.example`: a three-phase example flow (create a ride,
  charge the card, stage the receipt) to read and to run the harness on.
"""

from __future__ import annotations

from .harness import (
    CrashReport,
    KillPoint,
    KillResult,
    Recovery,
    Target,
    Worker,
    WorkerResult,
    crash_test,
    load_target,
    settle,
    spawn_worker,
)
from .history import (
    DEFAULT_TRANSIENT,
    Effect,
    History,
    HistoryReport,
    Operation,
    Pending,
    Property,
    Violation,
)
from .provider import Charge, FakeProvider, Fault, IdempotencyKeyReused, ProviderError

__all__ = [
    "DEFAULT_TRANSIENT",
    "Charge",
    "CrashReport",
    "Effect",
    "FakeProvider",
    "Fault",
    "History",
    "HistoryReport",
    "IdempotencyKeyReused",
    "KillPoint",
    "KillResult",
    "Operation",
    "Pending",
    "Property",
    "ProviderError",
    "Recovery",
    "Target",
    "Violation",
    "Worker",
    "WorkerResult",
    "crash_test",
    "load_target",
    "settle",
    "spawn_worker",
]
