"""One process that runs every background service until told to stop (DESIGN 7).

Each service runs its :meth:`~._service.Service.run_forever` loop on a thread of its
own, all sharing one store (its pool) and one stop event. Setting the event (the CLI
does on SIGTERM or SIGINT) lets each finish its current batch and return; nothing is
left half-done, because every batch is one transaction.

>>> stop = threading.Event()
>>> worker = Worker(store, flows=app.flows, jobs=app.jobs)   # doctest: +SKIP
>>> with stop_on_signals(stop):                             # doctest: +SKIP
...     worker.run(stop)
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from ..flows import FlowRegistry
from ..stores import Store
from ._service import Service, Signals
from .completer import Completer, CompleterConfig
from .enqueuer import Enqueuer, EnqueuerConfig, JobSink
from .jobs import JobRegistry, JobRunner, JobRunnerConfig
from .metrics import Metrics
from .reaper import Reaper, ReaperConfig
from .sweeper import Sweeper, SweeperConfig

log = logging.getLogger("idempotence.maintenance.worker")


class Worker:
    """The sweeper, completer, reaper and enqueuer, plus the job runner when ``jobs``
    is given, each on its own thread."""

    def __init__(
        self,
        store: Store,
        *,
        flows: FlowRegistry | None = None,
        jobs: JobRegistry | None = None,
        sink: JobSink | None = None,
        sweeper: SweeperConfig | None = None,
        completer: CompleterConfig | None = None,
        reaper: ReaperConfig | None = None,
        enqueuer: EnqueuerConfig | None = None,
        runner: JobRunnerConfig | None = None,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        common: dict[str, Any] = {"signals": signals, "metrics": metrics}
        self.services: list[Service[Any, Any]] = [
            Sweeper(store, sweeper, **common),
            Completer(store, completer, flows=flows, **common),
            Reaper(store, reaper, **common),
            Enqueuer(store, enqueuer, sink=sink, **common),
        ]
        if jobs is not None:
            self.services.append(JobRunner(store, runner, jobs=jobs, **common))

    def run(self, stop: threading.Event) -> None:
        """Run every service until ``stop`` is set, then wait for each to finish."""
        threads = [
            threading.Thread(
                target=service.run_forever, args=(stop,), name=f"idempotence-{service.name}"
            )
            for service in self.services
        ]
        for thread in threads:
            thread.start()
        log.info(
            "worker running: %s",
            ", ".join(s.name for s in self.services),
            extra={"services": [s.name for s in self.services]},
        )
        try:
            # Wait on the event, not on join(): the main thread must stay free to run
            # the signal handlers that set it.
            while not stop.wait(0.5):
                pass
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        log.info("worker stopped")


@contextlib.contextmanager
def stop_on_signals(
    stop: threading.Event, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
) -> Iterator[None]:
    """Set ``stop`` on the first of ``signals``; restore the old handlers on exit.

    A second signal while stopping falls through to the previous handler (Ctrl-C
    twice interrupts at once). Call from the main thread.
    """
    previous: dict[signal.Signals, Any] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if stop.is_set():
            old = previous.get(sig)
            if callable(old):
                old(signum, frame)
            return
        log.info("%s received: stopping after the current batches", sig.name)
        stop.set()

    for sig in signals:
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
