"""One process that runs every background service until told to stop (DESIGN 7).

Each service runs its ``run_forever`` loop at the same time as the others (the async
worker: as tasks of one event loop; the sync worker generated from it: each on a
thread of its own), all sharing one store (its pool) and one stop event. Setting the
event (the CLI does on SIGTERM or SIGINT) lets each finish its current batch and
return; nothing is left half-done, because every batch is one transaction.

The worker on an async store is the one for applications written async: its
completer resumes flows whose phases and foreign calls are coroutines, and its job
runner awaits coroutine job functions. ``idempotence worker`` runs it when a
registered flow has a coroutine step, or with ``--async``.

```python
stop = AsyncEvent()
worker = AsyncWorker(store, flows=app.flows, jobs=app.jobs)
with stop_on_signals(stop):
    await worker.run(stop)
```
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from .._concurrency import AsyncEvent, run_until_stopped_async
from ..flows import FlowRegistry
from ..metrics import Metrics
from ..stores import AsyncStore
from ._completer_shared import CompleterConfig
from ._enqueuer_shared import EnqueuerConfig
from ._jobs_shared import JobRegistry, JobRunnerConfig
from ._reaper_shared import ReaperConfig
from ._service_async import AsyncService
from ._service_shared import Signals
from ._stop import stop_on_signals
from ._sweeper_shared import SweeperConfig
from .completer_async import AsyncCompleter
from .enqueuer_async import AsyncEnqueuer, AsyncJobSink
from .jobs_async import AsyncJobRunner
from .reaper_async import AsyncReaper
from .sweeper_async import AsyncSweeper

__all__ = ["AsyncWorker", "stop_on_signals"]

log = logging.getLogger("idempotence.maintenance.worker")


class AsyncWorker:
    """The sweeper, completer, reaper and enqueuer, plus the job runner when ``jobs``
    is given, all running at once."""

    def __init__(
        self,
        store: AsyncStore,
        *,
        flows: FlowRegistry | None = None,
        jobs: JobRegistry | None = None,
        sink: AsyncJobSink | None = None,
        sweeper: SweeperConfig | None = None,
        completer: CompleterConfig | None = None,
        reaper: ReaperConfig | None = None,
        enqueuer: EnqueuerConfig | None = None,
        runner: JobRunnerConfig | None = None,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        common: dict[str, Any] = {"signals": signals, "metrics": metrics}
        self.services: list[AsyncService[Any, Any]] = [
            AsyncSweeper(store, sweeper, **common),
            AsyncCompleter(store, completer, flows=flows, **common),
            AsyncReaper(store, reaper, **common),
            AsyncEnqueuer(store, enqueuer, sink=sink, **common),
        ]
        if jobs is not None:
            self.services.append(AsyncJobRunner(store, runner, jobs=jobs, **common))

    async def run(self, stop: AsyncEvent) -> None:
        """Run every service until ``stop`` is set, then wait for each to finish."""
        names = [s.name for s in self.services]
        log.info("worker running: %s", ", ".join(names), extra={"services": names})
        await run_until_stopped_async(
            [functools.partial(s.run_forever, stop) for s in self.services],
            [f"idempotence-{name}" for name in names],
            stop,
        )
        log.info("worker stopped")
