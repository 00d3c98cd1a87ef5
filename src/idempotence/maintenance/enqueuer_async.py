"""The enqueuer (B4): deliver committed staged jobs to a job runner.

A phase stages jobs in its own transaction (R7), so a job exists exactly when the phase
committed. The enqueuer takes a batch out of the staging table and hands it to a
[`AsyncJobSink`][idempotence.maintenance.worker_async.AsyncJobSink] in ONE transaction,
which commits only after the sink accepted the batch: a crash in between leaves the jobs
staged, and the next pass delivers them again. A sink therefore sees a job at least
once, and must deduplicate by ``job_key``.

A sink that cannot deliver (its broker down, refusing or not confirming) raises
[`BrokerUnavailable`][idempotence.maintenance.BrokerUnavailable]: the jobs stay
staged, and ``run_forever`` tries again after a backoff, ``sink_backoff`` doubling up
to ``sink_max_backoff`` ([`EnqueuerConfig`][idempotence.maintenance.EnqueuerConfig]),
instead of every ``interval``. It says so once as the outage begins and once as it
ends, not at every attempt.

The built-in sink,
[`AsyncRunnerSink`][idempotence.maintenance.enqueuer_async.AsyncRunnerSink], inserts
into the built-in runner's table (`jobs`) in that same transaction, ``ON CONFLICT
(job_key) DO NOTHING``: taking and delivering commit together, so each ``job_key``
arrives exactly once.

A batch the database aborted for a deadlock or a serialization failure (two
enqueuers at once, say) delivered nothing and runs again at once, a few times at
most ([`TransientError`][idempotence.stores.TransientError] after that: the next pass
tries again).

```python
await AsyncEnqueuer(store).run_once()
# EnqueueResult(delivered=('rides-12-started-email-0',), duplicates=0, batches=1, ...)
```
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from .._concurrency import AsyncEvent
from ..metrics import Metrics
from ..states import StagedJob
from ..stores import AsyncStore, AsyncTransaction
from ..stores._sql.store_async import retried_async
from . import _ops
from ._enqueuer_shared import EnqueuerConfig, EnqueueResult, SinkBackoff, enqueue_summary
from ._service_async import AsyncService
from ._service_shared import Progress, Signals
from ._sinks_shared import BrokerUnavailable

__all__ = [
    "AsyncEnqueuer",
    "AsyncJobSink",
    "AsyncRunnerSink",
    "EnqueueResult",
    "EnqueuerConfig",
]


class AsyncJobSink(Protocol):
    """Where the enqueuer delivers jobs.

    ``deliver`` runs inside the transaction that took ``jobs`` out of the staging
    table; raising rolls it back, and the jobs stay staged. It returns the job keys
    it accepted as new (a repeat of a known ``job_key`` is not new). It raises
    [`BrokerUnavailable`][idempotence.maintenance.BrokerUnavailable] when its queue
    did not take the batch, so that the enqueuer backs off.
    """

    async def deliver(
        self, store: AsyncStore, tx: AsyncTransaction, jobs: Sequence[StagedJob]
    ) -> list[str]: ...


class AsyncRunnerSink:
    """Delivers into the built-in runner's table, in the enqueuer's transaction:
    exactly once per ``job_key``."""

    async def deliver(
        self, store: AsyncStore, tx: AsyncTransaction, jobs: Sequence[StagedJob]
    ) -> list[str]:
        return await store._perform(lambda d: _ops.deliver_jobs(d, jobs), tx=tx)


class AsyncEnqueuer(AsyncService[EnqueuerConfig, EnqueueResult]):
    """Moves staged jobs to ``sink`` (default: the built-in runner); see the module
    docstring. ``sleep(seconds, stop)``, when given, is how it waits between passes and
    batches (returning early once ``stop`` is set): a test hands in one that records
    the pauses and moves a clock of its own, to read the backoff's schedule without
    waiting for it."""

    name = "enqueuer"

    def __init__(
        self,
        store: AsyncStore,
        config: EnqueuerConfig | None = None,
        *,
        sink: AsyncJobSink | None = None,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
        sleep: Callable[[float, AsyncEvent], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(
            store, config or EnqueuerConfig(), signals=signals, metrics=metrics, sleep=sleep
        )
        self.sink: AsyncJobSink = sink if sink is not None else AsyncRunnerSink()
        self._backoff = SinkBackoff(self.config, self._random)

    async def _pass(self, stop: AsyncEvent, progress: Progress | None) -> EnqueueResult:
        started = time.monotonic()
        cfg = self.config
        delivered: list[str] = []
        duplicates = 0

        async def batch() -> int:
            nonlocal duplicates
            async with self.store.transaction() as tx:
                await self.store._perform(
                    lambda d: _ops.statement_timeout(d, cfg.query_timeout), tx=tx
                )
                jobs = await self.store.take_staged_jobs(tx, cfg.batch_size)
                self._emit("batch_locked", jobs)
                new = await self.sink.deliver(self.store, tx, jobs) if jobs else []
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

        # Two enqueuers' batches can deadlock (InnoDB), or one fail to serialize: the
        # database rolled the batch back whole, so it runs again, as a crash would have
        # it run at the next pass (a sink sees a job at least once anyway).
        batches = await self._drain("delivered", lambda: retried_async(batch), stop, progress)
        return EnqueueResult(tuple(delivered), duplicates, batches, time.monotonic() - started)

    def _summary(self, result: EnqueueResult) -> tuple[str, dict[str, Any]]:
        return enqueue_summary(result)

    def _after_pass(self, result: EnqueueResult | None, failure: Exception | None) -> float:
        backoff = self._backoff
        fields = {"service": self.name}
        if isinstance(failure, BrokerUnavailable):
            delay = backoff.failed()
            # Said once as the outage begins; each later attempt only at debug.
            level = logging.WARNING if backoff.failures == 1 else logging.DEBUG
            self.log.log(
                level,
                "the sink did not take the staged jobs, which stay staged; trying again "
                "in %.1fs, waiting longer after each failure (up to %gs): %s",
                delay,
                self.config.sink_max_backoff,
                failure,
                extra={**fields, "failures": backoff.failures, "delay": delay},
            )
            self._emit("backoff", delay)
            return delay
        # Only a batch the sink took ends an outage: a pass with nothing staged did
        # not reach the broker.
        took = result is not None and (result.delivered or result.duplicates)
        if took and (failures := backoff.succeeded()):
            self.log.info(
                "the sink takes staged jobs again, after %d failed attempt(s)",
                failures,
                extra={**fields, "failures": failures},
            )
        return super()._after_pass(result, failure)
