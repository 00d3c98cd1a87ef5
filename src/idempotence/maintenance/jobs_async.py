"""The built-in job runner (B4): runs the jobs the enqueuer delivered.

Register a Python function per job name; the runner calls ``fn(job)`` with a
[`Job`][idempotence.maintenance.jobs_async.Job]. On an async store the runner awaits
what the function returns, so it may be a coroutine function (a blocking one holds up
the event loop while it runs); on a sync store an awaitable fails the job. Execution is
at-least-once: a runner that dies mid-job leaves it to be picked again when its lease
ends, so a function must deduplicate its own side effects by ``job.job_key`` (send it as
the email provider's idempotency key, or record it in the same transaction as the
function's writes). A job that raises is retried after an exponential, jittered backoff,
up to ``max_attempts`` times, and is then marked ``dead`` for a human.

The registry is in `_jobs_shared`, shared by both flavours (F7).

```python
jobs = JobRegistry()
@jobs.register("send_receipt")
async def send_receipt(job: Job) -> None:
    await mailer.send(job.args["to"], idempotency_key=job.job_key)
await AsyncJobRunner(store, jobs=jobs).run_once()
```
"""

from __future__ import annotations

import time
from typing import Any

from .._awaitables import settle_async
from .._concurrency import AsyncEvent
from ..metrics import Metrics
from ..stores import AsyncStore
from . import _ops
from ._jobs_shared import (
    NOT_SYNC_JOB,
    JobFn,
    JobRegistry,
    JobRunnerConfig,
    JobRunResult,
    backoff,
    default_jobs,
    job_fields,
    jobs,
    run_summary,
)
from ._ops import Job
from ._service_async import AsyncService
from ._service_shared import Progress, Signals

__all__ = [
    "AsyncJobRunner",
    "Job",
    "JobFn",
    "JobRegistry",
    "JobRunResult",
    "JobRunnerConfig",
    "default_jobs",
    "jobs",
]


class AsyncJobRunner(AsyncService[JobRunnerConfig, JobRunResult]):
    """Runs due jobs of the names in ``jobs``; see the module docstring. Jobs of other
    names are left for a runner that knows them."""

    name = "jobs"

    def __init__(
        self,
        store: AsyncStore,
        config: JobRunnerConfig | None = None,
        *,
        jobs: JobRegistry | None = None,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(store, config or JobRunnerConfig(), signals=signals, metrics=metrics)
        self.jobs = jobs if jobs is not None else default_jobs

    async def _pass(self, stop: AsyncEvent, progress: Progress | None) -> JobRunResult:
        started = time.monotonic()
        cfg = self.config
        names = list(self.jobs)
        outcomes: dict[str, list[str]] = {"done": [], "ready": [], "dead": []}

        async def batch() -> int:
            picked = await self.store._perform(
                lambda d: _ops.pick_jobs(d, names, cfg.lease, cfg.batch_size, cfg.query_timeout)
            )
            for job in picked:
                outcome = await self._run(job)
                if outcome is not None:
                    outcomes[outcome].append(job.job_key)
            return len(picked)

        batches = await self._drain("ran", batch, stop, progress) if names else 0
        return JobRunResult(
            tuple(outcomes["done"]),
            tuple(outcomes["ready"]),
            tuple(outcomes["dead"]),
            batches,
            time.monotonic() - started,
        )

    async def _run(self, job: Job) -> str | None:
        cfg = self.config
        fields = job_fields(self.name, job)
        try:
            await settle_async(self.jobs.get(job.name)(job), NOT_SYNC_JOB.format(job.name))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            delay = backoff(cfg, job.attempt)
            status = await self.store._perform(
                lambda d: _ops.job_failed(d, job, error, delay, cfg.max_attempts, cfg.query_timeout)
            )
            if status == "dead":
                self.log.error(
                    "job %r failed for the last time: dead",
                    job.job_key,
                    exc_info=True,
                    extra={**fields, "error": error},
                )
            elif status == "ready":
                self.log.warning(
                    "job %r failed; retrying in %s",
                    job.job_key,
                    delay,
                    exc_info=True,
                    extra={**fields, "error": error},
                )
            # None: the lease ran out and another runner owns the job now.
            self.metrics.jobs_executed(
                {"ready": "retried", "dead": "dead"}.get(status or "", "superseded")
            )
            return status
        done = await self.store._perform(lambda d: _ops.job_done(d, job, cfg.query_timeout))
        self.log.info("job %r done", job.job_key, extra=fields)
        self.metrics.jobs_executed("done" if done else "superseded")
        # Not done: the lease ran out and another runner owns the job now.
        return "done" if done else None

    def _summary(self, result: JobRunResult) -> tuple[str, dict[str, Any]]:
        return run_summary(result)
