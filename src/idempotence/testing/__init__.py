"""Testing tools for flows: a fake payment provider and the crash-injection harness (F4).

* [`FakeProvider`][idempotence.testing.provider.FakeProvider]: a payment provider with
  its own durable store, Stripe-like idempotency keys, declines, injectable faults, and
  commit hooks.
* [`crash_test`][idempotence.testing.harness.crash_test]: run a flow in child processes,
  SIGKILL it at every boundary, recover by retry and by resume, and assert exactly-once
  effects (`idempotence.testing.harness`).
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
from .provider import Charge, FakeProvider, Fault, IdempotencyKeyReused, ProviderError

__all__ = [
    "Charge",
    "CrashReport",
    "FakeProvider",
    "Fault",
    "IdempotencyKeyReused",
    "KillPoint",
    "KillResult",
    "ProviderError",
    "Recovery",
    "Target",
    "Worker",
    "WorkerResult",
    "crash_test",
    "load_target",
    "settle",
    "spawn_worker",
]
