"""Background services and operator tooling (DESIGN 7, F5).

Four services with one shape (:mod:`._service`): a config with named defaults and
validation, ``run_once()`` returning a frozen result, batches until a short page with
jittered pauses between them, a timeout per statement, ``FOR UPDATE SKIP LOCKED`` so
that any number of nodes can run them at once, and ``run_forever(stop)``.

* :class:`Sweeper` (B1) releases expired locks, bumping the fencing token;
* :class:`Completer` (B2) resumes abandoned keys through their flows;
* :class:`Reaper` (B3) stores a 408 on expired unfinished keys and deletes expired
  finished ones;
* :class:`Enqueuer` (B4) delivers staged jobs, by default to the built-in
  :class:`JobRunner`.

:class:`Worker` runs them all; ``idempotence worker`` is the same from the shell.

>>> from idempotence.maintenance import Sweeper, Reaper
>>> Sweeper(store).run_once().count                # doctest: +SKIP
0
"""

from ._ops import ExpiredKey, Job, KeyRow, PickedKey, SweptKey
from ._service import ServiceConfig, Signals
from .admin import KeyIsLocked, Stats, evict_key, list_keys, show_key, stats
from .completer import (
    Completer,
    CompleterConfig,
    CompleteResult,
    Completion,
    CompletionOutcome,
)
from .enqueuer import Enqueuer, EnqueuerConfig, EnqueueResult, JobSink, RunnerSink
from .jobs import JobRegistry, JobRunner, JobRunnerConfig, JobRunResult
from .metrics import Metrics, default_metrics
from .reaper import Reaper, ReaperConfig, ReapResult, Retention
from .reconcile import Reconciler, ReconcilerRegistry, Reconciliation, reconcile, reconcilers
from .sweeper import Sweeper, SweeperConfig, SweepResult
from .worker import Worker, stop_on_signals

# The default job registry stays idempotence.maintenance.jobs.jobs: re-exported here it
# would hide the jobs module itself.
__all__ = [
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
