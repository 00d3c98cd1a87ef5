"""The worker (every service on its own thread, one stop event), the signal handling
the CLI uses, and the reconciliation hook (B5)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from idempotence import ConfigurationError
from idempotence.flows import Flow
from idempotence.maintenance import (
    AsyncWorker,
    Completer,
    CompleterConfig,
    Enqueuer,
    EnqueuerConfig,
    JobRunner,
    JobRunnerConfig,
    Reaper,
    ReaperConfig,
    ReconcilerRegistry,
    Signals,
    Sweeper,
    SweeperConfig,
    Worker,
    reconcile,
    stop_on_signals,
)
from idempotence.maintenance.reconcile import parse_since
from tests.maintenance import app
from tests.maintenance.support import EXPIRED, Backend, Flavour, claim, new_scope

QUICK: dict[str, Any] = {"interval": 0.05, "batch_pause": 0.0}


def test_the_worker_runs_every_service_until_stopped(db: Backend) -> None:
    scope = new_scope()
    lease = db.store.claim(app.checkout.request(scope=scope, key="k", fingerprint="f")).lease
    assert lease is not None
    db.store.release(lease)
    claim(db.store, scope, "crashed", lock_timeout=EXPIRED)
    signals, stop = Signals(), threading.Event()
    worker = Worker(
        db.store,
        flows=app.flows,
        jobs=app.jobs,
        sweeper=SweeperConfig(**QUICK),
        completer=CompleterConfig(grace=timedelta(0), **QUICK),
        reaper=ReaperConfig(**QUICK),
        enqueuer=EnqueuerConfig(**QUICK),
        runner=JobRunnerConfig(**QUICK),
        signals=signals,
    )
    assert [s.name for s in worker.services] == [
        "sweeper",
        "completer",
        "reaper",
        "enqueuer",
        "jobs",
    ]
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while db.count("idempotence_jobs", "status = 'done'") < 1:
            assert time.monotonic() < deadline, "the worker never ran the receipt job"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    stopped = {signals.wait(f"{name}.stopped", timeout=1) for name in ("sweeper", "reaper")}
    assert stopped == {None}
    record = db.store.get(scope, "crashed")
    assert record is not None and record.locked_at is None


def test_the_async_worker_runs_every_service_until_stopped_f7(db: Backend) -> None:
    """The worker on an async store runs the same services as tasks of one loop; its
    completer resumes a key of an async flow (coroutine phase and call) (B2, F7)."""
    scope = new_scope()
    request = app.async_checkout.request(scope=scope, key="k", fingerprint="f")
    lease = db.store.claim(request).lease
    assert lease is not None
    db.store.release(lease)
    claim(db.store, scope, "crashed", lock_timeout=EXPIRED)
    signals = Signals()
    worker = AsyncWorker(
        db.open_async(),
        flows=app.async_flows,
        jobs=app.jobs,
        sweeper=SweeperConfig(**QUICK),
        completer=CompleterConfig(grace=timedelta(0), **QUICK),
        reaper=ReaperConfig(**QUICK),
        enqueuer=EnqueuerConfig(**QUICK),
        runner=JobRunnerConfig(**QUICK),
        signals=signals,
    )
    assert [s.name for s in worker.services] == [
        "sweeper",
        "completer",
        "reaper",
        "enqueuer",
        "jobs",
    ]

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        deadline = time.monotonic() + 15
        while db.count("idempotence_jobs", "status = 'done'") < 1:
            assert not task.done(), task
            assert time.monotonic() < deadline, "the worker never ran the receipt job"
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 10)

    db.loop.run(run())
    record = db.store.get(scope, "k")
    assert record is not None and record.response is not None
    assert record.response.status == 201
    crashed = db.store.get(scope, "crashed")
    assert crashed is not None and crashed.locked_at is None
    stopped = {signals.wait(f"{name}.stopped", timeout=1) for name in ("sweeper", "reaper")}
    assert stopped == {None}


def test_stop_on_signals_sets_an_asyncio_event_too() -> None:
    before = signal.getsignal(signal.SIGTERM)

    async def main() -> None:
        stop = asyncio.Event()
        with stop_on_signals(stop):
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(stop.wait(), 5)

    asyncio.run(main())
    assert signal.getsignal(signal.SIGTERM) is before


def test_stop_on_signals_sets_the_event_and_restores_the_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM)
    stop = threading.Event()
    with stop_on_signals(stop):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
    assert signal.getsignal(signal.SIGTERM) is before


# -- B5 ----------------------------------------------------------------------------------------


class Listed:
    def __init__(self, foreign: Iterable[object], local: Iterable[object]) -> None:
        self.foreign, self.local = list(foreign), list(local)
        self.windows: list[tuple[datetime, datetime]] = []

    def foreign_ids(self, since: datetime, until: datetime) -> Iterable[object]:
        self.windows.append((since, until))
        return self.foreign

    def local_ids(self, since: datetime, until: datetime) -> Iterable[object]:
        return self.local


def test_b5_reconcile_reports_both_kinds_of_difference() -> None:
    since = datetime(2024, 5, 1, tzinfo=UTC)
    until = since + timedelta(days=1)
    sides = Listed(["ch_1", "ch_2", 3], ["ch_2", 3, "ride_9"])

    result = reconcile(sides, since, until, flow="rides")  # type: ignore[arg-type]

    assert result.foreign_only == ("ch_1",)
    assert result.local_only == ("ride_9",)
    assert result.matched == 2
    assert not result.clean
    assert sides.windows == [(since, until)]
    assert reconcile(Listed([1], [1]), since, until).clean  # type: ignore[arg-type]


def test_b5_reconcile_refuses_an_empty_window() -> None:
    now = datetime.now(UTC)
    with pytest.raises(ConfigurationError, match="window is empty"):
        reconcile(Listed([], []), now, now - timedelta(hours=1))  # type: ignore[arg-type]


def test_b5_a_registry_takes_a_flow_or_its_name_and_checks_the_shape() -> None:
    registry = ReconcilerRegistry()
    sides = Listed([], [])
    registry.register(Flow("rides"), sides)  # type: ignore[arg-type]
    assert registry.get("rides") is sides  # type: ignore[comparison-overlap]
    with pytest.raises(ConfigurationError, match="foreign_ids"):
        registry.register("bad", object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="registered: rides"):
        registry.get("taxis")


def test_b5_parse_since() -> None:
    now = datetime(2024, 5, 2, 12, tzinfo=UTC)
    assert parse_since("24h", now) == datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert parse_since("7d", now) == datetime(2024, 4, 25, 12, tzinfo=UTC)
    assert parse_since("90m", now) == datetime(2024, 5, 2, 10, 30, tzinfo=UTC)
    assert parse_since("2024-05-01T08:00") == datetime(2024, 5, 1, 8, tzinfo=UTC)
    offset = parse_since("2024-05-01T08:00+02:00")
    assert offset == datetime(2024, 5, 1, 6, tzinfo=UTC)
    with pytest.raises(ConfigurationError, match="not a time"):
        parse_since("last tuesday")


# -- every service stops the same way -----------------------------------------------------------


def make_service(name: str, flavour: Flavour, signals: Signals) -> Any:
    makers: dict[str, Callable[[], Any]] = {
        "sweeper": lambda: flavour(Sweeper, SweeperConfig(interval=3600), signals=signals),
        "completer": lambda: flavour(
            Completer, CompleterConfig(interval=3600), flows=app.flows, signals=signals
        ),
        "reaper": lambda: flavour(Reaper, ReaperConfig(interval=3600), signals=signals),
        "enqueuer": lambda: flavour(Enqueuer, EnqueuerConfig(interval=3600), signals=signals),
        "jobs": lambda: flavour(
            JobRunner, JobRunnerConfig(interval=3600), jobs=app.jobs, signals=signals
        ),
    }
    return makers[name]()


@pytest.mark.parametrize("name", ["sweeper", "completer", "reaper", "enqueuer", "jobs"])
def test_every_service_stops_promptly_when_told(flavour: Flavour, name: str) -> None:
    """Sync and async (F7)."""
    signals, stop = Signals(), threading.Event()
    service = make_service(name, flavour, signals)
    thread = threading.Thread(target=service.run_forever, args=(stop,))
    thread.start()
    signals.wait(f"{name}.pass")
    started = time.monotonic()
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 2  # not the hour-long interval
    signals.wait(f"{name}.stopped", timeout=1)


def test_a_stop_ends_a_pass_between_batches(db: Backend) -> None:
    scope = new_scope()
    for i in range(25):
        claim(db.store, scope, f"k{i}", lock_timeout=EXPIRED)
    time.sleep(0.02)
    stop = threading.Event()
    stop.set()
    sweeper = Sweeper(db.store, SweeperConfig(batch_size=10))
    result = sweeper.run_once(stop)
    assert (result.count, result.batches) == (10, 1)  # the batch in hand, then stop
    assert sweeper.run_once().count == 15


def test_a_failed_pass_does_not_end_run_forever(db: Backend) -> None:
    """The service outlives a failing database: it logs and tries at the next interval."""
    signals, stop = Signals(), threading.Event()
    failures = iter([RuntimeError("database restarting")])

    class Flaky(Sweeper):
        def _pass(self, stop: threading.Event, progress: Any) -> Any:
            error = next(failures, None)
            if error is not None:
                raise error
            return super()._pass(stop, progress)

    flaky = Flaky(db.store, SweeperConfig(interval=0.05), signals=signals)
    thread = threading.Thread(target=flaky.run_forever, args=(stop,))
    thread.start()
    try:
        signals.wait("sweeper.pass", timeout=5)  # the pass after the failed one
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
