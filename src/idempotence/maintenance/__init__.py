"""Background services and operator tooling (DESIGN 7, F5).

Four services with one shape (`_service`): a config with named defaults and validation,
``run_once()`` returning a frozen result, batches until a short page with jittered
pauses between them, a timeout per statement, ``FOR UPDATE SKIP LOCKED`` so that any
number of nodes can run them at once, and ``run_forever(stop)``. Each is written once,
async, on an [`AsyncStore`][idempotence.testing.harness.AsyncStore] (``AsyncSweeper``
and so on, in the ``*_async`` modules), and its sync twin on a
[`Store`][idempotence.testing.harness.Store] is generated from it (F7); an async
application's flows, with coroutine phases and foreign calls, are resumed by
[`AsyncCompleter`][idempotence.maintenance.worker_async.AsyncCompleter].

* [`Sweeper`][idempotence.maintenance.worker.Sweeper] (B1) releases expired locks,
  bumping the fencing token;
* [`Completer`][idempotence.maintenance.worker.Completer] (B2) resumes abandoned keys
  through their flows;
* [`Reaper`][idempotence.maintenance.worker.Reaper] (B3) stores a 408 on expired
  unfinished keys and deletes expired finished ones;
* [`Enqueuer`][idempotence.maintenance.worker.Enqueuer] (B4) delivers staged jobs, by
  default to the built-in [`JobRunner`][idempotence.maintenance.worker.JobRunner].

[`Worker`][idempotence.maintenance.worker.Worker]
([`AsyncWorker`][idempotence.maintenance.worker_async.AsyncWorker] on an async store)
runs them all; ``idempotence worker`` is the same from the shell.

```python
from idempotence.maintenance import Sweeper, Reaper
Sweeper(store).run_once().count
# 0
```
"""

from ..metrics import Metrics, default_metrics
from ._ops import ExpiredKey, Job, KeyRow, PickedKey, SweptKey
from ._service_shared import ServiceConfig, Signals
from ._stop import stop_on_signals
from .admin import KeyIsLocked, Stats, evict_key, list_keys, show_key, stats
from .completer import (
    Completer,
    CompleterConfig,
    CompleteResult,
    Completion,
    CompletionOutcome,
)
from .completer_async import AsyncCompleter
from .enqueuer import Enqueuer, EnqueuerConfig, EnqueueResult, JobSink, RunnerSink
from .enqueuer_async import AsyncEnqueuer, AsyncJobSink, AsyncRunnerSink
from .jobs import JobRegistry, JobRunner, JobRunnerConfig, JobRunResult
from .jobs_async import AsyncJobRunner
from .reaper import Reaper, ReaperConfig, ReapResult, Retention
from .reaper_async import AsyncReaper
from .reconcile import Reconciler, ReconcilerRegistry, Reconciliation, reconcile, reconcilers
from .sinks import BrokerUnavailable, CelerySink, RabbitMQSink
from .sinks_async import AsyncCelerySink, AsyncRabbitMQSink
from .sweeper import Sweeper, SweeperConfig, SweepResult
from .sweeper_async import AsyncSweeper
from .worker import Worker
from .worker_async import AsyncWorker

# The default job registry stays idempotence.maintenance.jobs.jobs: re-exported here it
# would hide the jobs module itself.
__all__ = [
    "AsyncCelerySink",
    "AsyncCompleter",
    "AsyncEnqueuer",
    "AsyncJobRunner",
    "AsyncJobSink",
    "AsyncRabbitMQSink",
    "BrokerUnavailable",
    "CelerySink",
    "RabbitMQSink",
    "AsyncReaper",
    "AsyncRunnerSink",
    "AsyncSweeper",
    "AsyncWorker",
    "CompleteResult",
    "Completer",
    "CompleterConfig",
    "Completion",
    "CompletionOutcome",
    "EnqueueResult",
    "Enqueuer",
    "EnqueuerConfig",
    "ExpiredKey",
    "Job",
    "JobRegistry",
    "JobRunResult",
    "JobRunner",
    "JobRunnerConfig",
    "JobSink",
    "KeyIsLocked",
    "KeyRow",
    "Metrics",
    "PickedKey",
    "ReapResult",
    "Reaper",
    "ReaperConfig",
    "Reconciler",
    "ReconcilerRegistry",
    "Reconciliation",
    "Retention",
    "RunnerSink",
    "ServiceConfig",
    "Signals",
    "Stats",
    "SweepResult",
    "Sweeper",
    "SweeperConfig",
    "SweptKey",
    "Worker",
    "default_metrics",
    "evict_key",
    "list_keys",
    "reconcile",
    "reconcilers",
    "show_key",
    "stats",
    "stop_on_signals",
]
