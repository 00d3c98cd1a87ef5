"""The built-in job runner (B4): runs the jobs the enqueuer delivered.

Register a Python function per job name; the runner calls ``fn(job)`` with a
:class:`Job`. Execution is at-least-once: a runner that dies mid-job leaves it to be
picked again when its lease ends, so a function must deduplicate its own side
effects by ``job.job_key`` (send it as the email provider's idempotency key, or
record it in the same transaction as the function's writes). A job that raises is
retried after an exponential, jittered backoff, up to ``max_attempts`` times, and is
then marked ``dead`` for a human.

>>> jobs = JobRegistry()
>>> @jobs.register("send_receipt")
... def send_receipt(job: Job) -> None:
...     mailer.send(job.args["to"], idempotency_key=job.job_key)   # doctest: +SKIP
>>> JobRunner(store, jobs=jobs).run_once()                          # doctest: +SKIP
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import ConfigurationError
from ..stores import Store
from . import _ops
from ._ops import Job
from ._service import Progress, Service, ServiceConfig, Signals, _invalid
from .metrics import Metrics

JobFn = Callable[[Job], Any]


class JobRegistry:
    """Job functions by name."""

    def __init__(self) -> None:
        self._fns: dict[str, JobFn] = {}

    def register(self, name: str) -> Callable[[JobFn], JobFn]:
        """Register the decorated function as job ``name``."""

        def add(fn: JobFn) -> JobFn:
            if name in self._fns and self._fns[name] is not fn:
                raise ConfigurationError(f"another function is registered as job {name!r}")
            self._fns[name] = fn
            return fn

        return add

    def get(self, name: str) -> JobFn:
        try:
            return self._fns[name]
        except KeyError:
            raise ConfigurationError(f"no function is registered as job {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._fns))


#: The default registry.
jobs = JobRegistry()
default_jobs = jobs


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRunnerConfig(ServiceConfig):
    """The runner's settings; see :class:`ServiceConfig`."""

    batch_size: int = 10
    interval: float = 1.0
    #: Attempts before a failing job is marked dead.
    max_attempts: int = 5
    #: The first retry's delay; each later one doubles, up to ``max_backoff``.
    backoff: timedelta = timedelta(seconds=10)
    max_backoff: timedelta = timedelta(hours=1)
    #: How long a picked job is the runner's: past it, another runner may run it
    #: again. Longer than any job takes.
    lease: timedelta = timedelta(minutes=5)

    def validate(self) -> None:
        ServiceConfig.validate(self)
        if self.max_attempts < 1:
            raise _invalid(self, "max_attempts", self.max_attempts, "must be at least 1")
        for name in ("backoff", "max_backoff", "lease"):
            if getattr(self, name) < timedelta(0):
                raise _invalid(self, name, getattr(self, name), "must not be negative")


@dataclass(frozen=True, slots=True)
class JobRunResult:
    """What one pass of the runner did."""

    #: Job keys that ran to the end.
    done: tuple[str, ...]
    #: Job keys that failed and will be retried.
    retried: tuple[str, ...]
    #: Job keys that failed for the last time.
    dead: tuple[str, ...]
    batches: int
    seconds: float


class JobRunner(Service[JobRunnerConfig, JobRunResult]):
    """Runs due jobs of the names in ``jobs``; see the module docstring. Jobs of other
    names are left for a runner that knows them."""

    name = "jobs"

    def __init__(
        self,
        store: Store,
        config: JobRunnerConfig | None = None,
        *,
        jobs: JobRegistry | None = None,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(store, config or JobRunnerConfig(), signals=signals, metrics=metrics)
        self.jobs = jobs if jobs is not None else default_jobs

    def _pass(self, stop: threading.Event, progress: Progress | None) -> JobRunResult:
        started = time.monotonic()
        d, cfg = self.store.dialect, self.config
        names = list(self.jobs)
        outcomes: dict[str, list[str]] = {"done": [], "ready": [], "dead": []}

        def batch() -> int:
            picked = self.store.perform(
                lambda: _ops.pick_jobs(d, names, cfg.lease, cfg.batch_size, cfg.query_timeout)
            )
            for job in picked:
                outcome = self._run(job)
                if outcome is not None:
                    outcomes[outcome].append(job.job_key)
            return len(picked)

        batches = self._drain("ran", batch, stop, progress) if names else 0
        return JobRunResult(
            tuple(outcomes["done"]),
            tuple(outcomes["ready"]),
            tuple(outcomes["dead"]),
            batches,
            time.monotonic() - started,
        )

    def _run(self, job: Job) -> str | None:
        d, cfg = self.store.dialect, self.config
        fields = {
            "service": self.name,
            "job_key": job.job_key,
            "job": job.name,
            "attempt": job.attempt,
            "scope": job.scope,
        }
        try:
            self.jobs.get(job.name)(job)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            backoff = self._backoff(job.attempt)
            status = self.store.perform(
                lambda: _ops.job_failed(d, job, error, backoff, cfg.max_attempts, cfg.query_timeout)
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
                    backoff,
                    exc_info=True,
                    extra={**fields, "error": error},
                )
            # None: the lease ran out and another runner owns the job now.
            self.metrics.jobs_executed(
                {"ready": "retried", "dead": "dead"}.get(status or "", "superseded")
            )
            return status
        done = self.store.perform(lambda: _ops.job_done(d, job, cfg.query_timeout))
        self.log.info("job %r done", job.job_key, extra=fields)
        self.metrics.jobs_executed("done" if done else "superseded")
        # Not done: the lease ran out and another runner owns the job now.
        return "done" if done else None

    def _summary(self, result: JobRunResult) -> tuple[str, dict[str, Any]]:
        done, retried, dead = len(result.done), len(result.retried), len(result.dead)
        return (
            f"ran {done + retried + dead} job(s): {done} done, {retried} to retry, {dead} dead",
            {
                "count": done + retried + dead,
                "done": done,
                "retried": retried,
                "dead": dead,
                "batches": result.batches,
            },
        )

    def _backoff(self, attempt: int) -> timedelta:
        # The exponent is capped so that a large max_attempts cannot overflow timedelta.
        base = self.config.backoff * (1 << min(max(attempt - 1, 0), 30))
        capped = min(base, self.config.max_backoff)
        return capped * random.uniform(0.75, 1.25)
