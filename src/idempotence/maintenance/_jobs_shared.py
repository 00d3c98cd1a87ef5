"""The job registry, the runner's settings, result and backoff (B4), shared by
[`AsyncJobRunner`][idempotence.maintenance.worker_async.AsyncJobRunner] and the
generated [`JobRunner`][idempotence.maintenance.worker.JobRunner]."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import ConfigurationError
from ._ops import Job
from ._service_shared import ServiceConfig, _invalid

JobFn = Callable[[Job], Any]

NOT_SYNC_JOB = (
    "job {!r} returned an awaitable: an async job function needs the AsyncJobRunner "
    "(idempotence worker --async)"
)
"""Why the sync runner refuses a job function that returned an awaitable (it fails
the job with this, and retries it as any failure)."""


class JobRegistry:
    """Job functions by name. A function may be a coroutine function if the runner
    is an async one."""

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


jobs = JobRegistry()
"""The default registry."""
default_jobs = jobs


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRunnerConfig(ServiceConfig):
    """The runner's settings; see [`ServiceConfig`][idempotence.maintenance.ServiceConfig]."""

    batch_size: int = 10
    interval: float = 1.0
    max_attempts: int = 5
    """Attempts before a failing job is marked dead."""
    backoff: timedelta = timedelta(seconds=10)
    """The first retry's delay; each later one doubles, up to ``max_backoff``."""
    max_backoff: timedelta = timedelta(hours=1)
    lease: timedelta = timedelta(minutes=5)
    """How long a picked job is the runner's: past it, another runner may run it
    again. Longer than any job takes."""

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

    done: tuple[str, ...]
    """Job keys that ran to the end."""
    retried: tuple[str, ...]
    """Job keys that failed and will be retried."""
    dead: tuple[str, ...]
    """Job keys that failed for the last time."""
    batches: int
    seconds: float


def backoff(config: JobRunnerConfig, attempt: int) -> timedelta:
    """The jittered delay before retrying a job that failed its ``attempt``."""
    # The exponent is capped so that a large max_attempts cannot overflow timedelta.
    base = config.backoff * (1 << min(max(attempt - 1, 0), 30))
    capped = min(base, config.max_backoff)
    return capped * random.uniform(0.75, 1.25)


def job_fields(service: str, job: Job) -> dict[str, Any]:
    return {
        "service": service,
        "job_key": job.job_key,
        "job": job.name,
        "attempt": job.attempt,
        "scope": job.scope,
    }


def run_summary(result: JobRunResult) -> tuple[str, dict[str, Any]]:
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
