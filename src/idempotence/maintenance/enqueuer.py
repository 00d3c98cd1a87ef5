"""The enqueuer (B4): deliver committed staged jobs to a job runner.

A phase stages jobs in its own transaction (R7), so a job exists exactly when the
phase committed. The enqueuer takes a batch out of the staging table and hands it to
a :class:`JobSink` in ONE transaction, which commits only after the sink accepted
the batch: a crash in between leaves the jobs staged, and the next pass delivers
them again. A sink therefore sees a job at least once, and must deduplicate by
``job_key``.

The built-in sink, :class:`RunnerSink`, inserts into the built-in runner's table
(:mod:`.jobs`) in that same transaction, ``ON CONFLICT (job_key) DO NOTHING``: taking
and delivering commit together, so each ``job_key`` arrives exactly once.

>>> Enqueuer(store).run_once()                        # doctest: +SKIP
EnqueueResult(delivered=('rides-12-started-email-0',), duplicates=0, batches=1, ...)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..states import StagedJob
from ..stores import Store, Transaction
from . import _ops
from ._service import Progress, Service, ServiceConfig, Signals
from .metrics import Metrics


class JobSink(Protocol):
    """Where the enqueuer delivers jobs.

    ``deliver`` runs inside the transaction that took ``jobs`` out of the staging
    table; raising rolls it back, and the jobs stay staged. It returns the job keys
    it accepted as new (a repeat of a known ``job_key`` is not new).
    """

    def deliver(self, store: Store, tx: Transaction, jobs: Sequence[StagedJob]) -> list[str]: ...


class RunnerSink:
    """Delivers into the built-in runner's table, in the enqueuer's transaction:
    exactly once per ``job_key``."""

    def deliver(self, store: Store, tx: Transaction, jobs: Sequence[StagedJob]) -> list[str]:
        return store.perform(lambda: _ops.deliver_jobs(store.dialect, jobs), tx=tx)


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueuerConfig(ServiceConfig):
    """The enqueuer's settings; see :class:`ServiceConfig`. Jobs wait for it, so it
    runs often."""

    interval: float = 1.0


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What one pass of the enqueuer did."""

    #: Job keys delivered for the first time, in staging order.
    delivered: tuple[str, ...]
    #: Staged jobs the sink already had (their job_key was delivered before).
    duplicates: int
    batches: int
    seconds: float


class Enqueuer(Service[EnqueuerConfig, EnqueueResult]):
    """Moves staged jobs to ``sink`` (default: the built-in runner); see the module
    docstring."""

    name = "enqueuer"

    def __init__(
        self,
        store: Store,
        config: EnqueuerConfig | None = None,
        *,
        sink: JobSink | None = None,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(store, config or EnqueuerConfig(), signals=signals, metrics=metrics)
        self.sink: JobSink = sink if sink is not None else RunnerSink()

    def _pass(self, stop: threading.Event, progress: Progress | None) -> EnqueueResult:
        started = time.monotonic()
        d, cfg = self.store.dialect, self.config
        delivered: list[str] = []
        duplicates = 0

        def batch() -> int:
            nonlocal duplicates
            with self.store.transaction() as tx:
                self.store.perform(lambda: _ops.statement_timeout(d, cfg.query_timeout), tx=tx)
                jobs = self.store.take_staged_jobs(tx, cfg.batch_size)
                self._emit("batch_locked", jobs)
                new = self.sink.deliver(self.store, tx, jobs) if jobs else []
            # Committed: only now do the jobs count as delivered.
            self.metrics.jobs_delivered(len(new))
            delivered.extend(new)
            duplicates += len(jobs) - len(new)
            if len(jobs) > len(new):
                self.log.info(
                    "%d staged job(s) were delivered before: dropped",
                    len(jobs) - len(new),
                    extra={"service": self.name, "count": len(jobs) - len(new)},
                )
            return len(jobs)

        batches = self._drain("delivered", batch, stop, progress)
        return EnqueueResult(tuple(delivered), duplicates, batches, time.monotonic() - started)

    def _summary(self, result: EnqueueResult) -> tuple[str, dict[str, Any]]:
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
