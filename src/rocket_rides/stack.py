"""Run the whole service: the provider, API workers, the background worker and, with a
broker, the receipt consumers (`broker`), as processes forked from one
supervisor that restarts whichever of them dies.

The supervisor imports everything once and then forks; a restart is a fork, a few
milliseconds, so a demo that kills workers every few requests spends its time on
requests, not on Python start-ups. Forking is only safe from a process with no
threads and no open connections, so the supervisor itself never opens the database:
even preparing it (migrations, tables, users) happens in a child.

Each child dies with the supervisor (``PR_SET_PDEATHSIG`` on Linux), so a killed
supervisor leaves nothing behind. The supervisor reports what happens through
``announce(event)``: the orchestrator reads JSON lines, ``demo serve`` prints text.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from idempotence.database import open_async_sql_store
from idempotence.errors import IdempotenceError
from idempotence.flows import FlowRegistry
from idempotence.http import Profile
from idempotence.maintenance import (
    AsyncWorker,
    CompleterConfig,
    EnqueuerConfig,
    JobRegistry,
    JobRunnerConfig,
    ReaperConfig,
    SweeperConfig,
    stop_on_signals,
)
from idempotence.states import DEFAULT_RETENTION
from idempotence.stores import AsyncStore

from .api import ApiSettings, create_app, tls_context
from .broker import BrokerConfig, Ledger, Publisher, consume
from .mailer import FakeMailer, receipt_jobs
from .provider import Faults, provider_app
from .rides import async_charger, rides_flow
from .schema import prepare

__all__ = ["Event", "StackConfig", "run_stack"]

Event = dict[str, Any]
_QUICK_DEATH = 1.0
"""A child that dies this soon after it started, by itself, is failing to start."""
_QUICK_DEATHS_ALLOWED = 5
_POLL = 0.02
_STOP_GRACE = 10.0
"""How long children get to stop after SIGTERM before they are killed."""


@dataclass(frozen=True, slots=True)
class StackConfig:
    """Everything the supervisor and its children need; JSON-serialisable, so the
    orchestrator can hand it to a supervisor process on its command line."""

    database: str
    data_dir: str
    """Where the provider's and the mailer's SQLite files go."""
    api_ports: tuple[int, ...]
    provider_port: int
    host: str = "127.0.0.1"
    profile: str = "ietf"
    chaos: bool = False
    """Honour the crash-injection headers (the demo's run only)."""
    lock_timeout: float = 10.0
    """How long a dead worker keeps a key from its retries (P4, P5)."""
    completer_grace: float = 10.0
    """How long the completer leaves an unfinished key to its client (B2)."""
    service_interval: float = 0.5
    """How often the background services look for work."""
    retention: float = DEFAULT_RETENTION.total_seconds()
    """How long a finished ride's key replays, in seconds (B3)."""
    reaper_interval: float = ReaperConfig().interval
    """How often the reaper deletes expired keys, in seconds."""
    faults: Faults = field(default_factory=Faults)
    seed: int | None = None
    log_level: str = "warning"
    broker: BrokerConfig | None = None
    """Receipts through RabbitMQ to guarded consumers (None: to the mailer)."""

    @property
    def provider_url(self) -> str:
        return f"http://{self.host}:{self.provider_port}"

    @property
    def mailer_path(self) -> str:
        return str(Path(self.data_dir) / "mailer.sqlite3")

    @property
    def provider_path(self) -> str:
        return str(Path(self.data_dir) / "provider.sqlite3")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> StackConfig:
        data = json.loads(text)
        data["api_ports"] = tuple(data["api_ports"])
        data["faults"] = Faults(**data["faults"])
        if data.get("broker") is not None:
            data["broker"] = BrokerConfig(**data["broker"])
        return cls(**data)


# -- the children ---------------------------------------------------------------------------


def _serve(app: Any, config: StackConfig, port: int) -> None:
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=port,
            log_level=config.log_level,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
    )
    server.run()


def _api(config: StackConfig, port: int) -> None:
    settings = ApiSettings(
        database=config.database,
        provider_url=config.provider_url,
        profile=Profile(config.profile),
        lock_timeout=config.lock_timeout,
        chaos=config.chaos,
        retention=config.retention,
    )
    _serve(create_app(settings), config, port)


def _provider(config: StackConfig) -> None:
    _serve(
        provider_app(config.provider_path, config.faults, seed=config.seed),
        config,
        config.provider_port,
    )


def _worker(config: StackConfig) -> None:
    """The sweeper, completer, reaper, enqueuer and job runner (DESIGN 7), on an async
    store: the completer resumes keys through the API's own flow, async charger and
    all (F7)."""
    asyncio.run(_work(config))


async def _work(config: StackConfig) -> None:
    publisher = None
    if config.broker is not None:
        publisher = Publisher(config.broker, Ledger(config.data_dir), seed=config.seed)
    async with (
        open_async_sql_store(config.database) as store,
        httpx.AsyncClient(base_url=config.provider_url, timeout=5.0) as client,
    ):
        jobs = None if publisher is None else publisher.jobs()
        worker = background_worker(config, store, client, jobs)
        stop = asyncio.Event()
        try:
            with stop_on_signals(stop):
                await worker.run(stop)
        finally:
            if publisher is not None:
                await publisher.close()


def background_worker(
    config: StackConfig,
    store: AsyncStore,
    client: httpx.AsyncClient,
    jobs: JobRegistry | None = None,
) -> AsyncWorker:
    """The demo's worker: its completer resumes rides through the API's own flow;
    ``jobs`` sends the receipts (default: through the mailer)."""
    interval = config.service_interval
    flows = FlowRegistry()
    flows.register(
        rides_flow(
            async_charger(client),
            profile=Profile(config.profile),
            lock_timeout=timedelta(seconds=config.lock_timeout),
            retention=timedelta(seconds=config.retention),
        )
    )
    return AsyncWorker(
        store,
        flows=flows,
        jobs=jobs or receipt_jobs(FakeMailer(config.mailer_path)),
        sweeper=SweeperConfig(interval=interval),
        completer=CompleterConfig(
            interval=interval, grace=timedelta(seconds=config.completer_grace)
        ),
        reaper=ReaperConfig(interval=config.reaper_interval),
        enqueuer=EnqueuerConfig(interval=interval / 2),
        runner=JobRunnerConfig(interval=interval / 2, backoff=timedelta(seconds=1)),
    )


def _warm_up() -> None:
    """Do once, before forking, what every child would otherwise do on each start."""
    # uvicorn imports its protocol and lifespan modules when a server starts.
    import uvicorn.lifespan.on
    import uvicorn.protocols.http.h11_impl
    import uvicorn.protocols.websockets.auto  # noqa: F401

    tls_context()
    with contextlib.suppress(ImportError):
        import pika  # noqa: F401  (the receipt consumers')


def _die_with_parent() -> None:
    # Linux only: the kernel sends us SIGKILL when the supervisor dies, however it dies.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _fork(target: Callable[[], None], log_level: str) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _die_with_parent()
        # Our stdout is the supervisor's report channel: children write to stderr.
        os.dup2(2, 1)
        logging.basicConfig(level=log_level.upper(), stream=sys.stderr)
        # One line per provider call is noise, even at info.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        target()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except (IdempotenceError, OSError) as exc:
        # A fault of the environment (the database unreachable, a port taken): one
        # line that says it, not a traceback.
        print(" ".join(f"{type(exc).__name__}: {exc}".split()), file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)
    raise AssertionError("unreachable")


# -- the supervisor -----------------------------------------------------------------------


@dataclass(slots=True)
class _Child:
    role: str
    port: int | None
    start: Callable[[], None]
    pid: int = 0
    started: float = 0.0


def run_stack(config: StackConfig, announce: Callable[[Event], None]) -> int:
    """Prepare the database, start every process, restart those that die, until
    SIGTERM or SIGINT; then stop them all. Returns the exit status."""
    stopping = threading.Event()
    children: dict[int, _Child] = {}

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        setup = _fork(lambda: prepare(config.database), config.log_level)
        _, status = os.waitpid(setup, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            announce({"event": "failed", "role": "setup"})
            return 1
        _warm_up()
        plan = [_Child("provider", config.provider_port, functools.partial(_provider, config))]
        plan += [
            _Child("api", port, functools.partial(_api, config, port)) for port in config.api_ports
        ]
        plan.append(_Child("worker", None, functools.partial(_worker, config)))
        if config.broker is not None:
            consumer = functools.partial(consume, config)
            plan += [_Child("consumer", None, consumer) for _ in range(config.broker.consumers)]
        for child in plan:
            _start(child, children, config, announce)
        return _supervise(children, config, announce, stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start(
    child: _Child,
    children: dict[int, _Child],
    config: StackConfig,
    announce: Callable[[Event], None],
    restart: bool = False,
) -> None:
    child.pid = _fork(child.start, config.log_level)
    child.started = time.monotonic()
    children[child.pid] = child
    announce(
        {
            "event": "started",
            "role": child.role,
            "port": child.port,
            "pid": child.pid,
            "restart": restart,
        }
    )


def _accepts(host: str, port: int) -> bool:
    """Whether a server listens on ``host:port`` yet."""
    try:
        socket.create_connection((host, port), timeout=0.2).close()
    except OSError:
        return False
    return True


def _supervise(
    children: dict[int, _Child],
    config: StackConfig,
    announce: Callable[[Event], None],
    stopping: threading.Event,
) -> int:
    quick_deaths = 0
    status_code = 0
    deadline: float | None = None
    waiting = {(config.host, child.port) for child in children.values() if child.port}
    while children:
        if waiting and not stopping.is_set():
            waiting = {address for address in waiting if not _accepts(*address)}
            if not waiting:
                announce({"event": "ready"})
        if stopping.is_set() and deadline is None:
            deadline = time.monotonic() + _STOP_GRACE
        if deadline is not None and time.monotonic() > deadline:
            for pid in list(children):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        # Polling, not a blocking wait: the loop must also notice the stop deadline.
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(_POLL)
            continue
        child = children.pop(pid, None)
        if child is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        announce(
            {
                "event": "exited",
                "role": child.role,
                "port": child.port,
                "pid": pid,
                "signal": -code if code < 0 else None,
                "code": code if code >= 0 else None,
                "stopping": stopping.is_set(),
            }
        )
        if stopping.is_set():
            continue
        if code >= 0 and time.monotonic() - child.started < _QUICK_DEATH:
            quick_deaths += 1
            if quick_deaths > _QUICK_DEATHS_ALLOWED:
                # A child that cannot start (a port in use, a database down) would be
                # restarted forever: give up, and say so.
                announce({"event": "failed", "role": child.role, "port": child.port})
                status_code = 1
                stopping.set()
                for other in list(children):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(other, signal.SIGTERM)
                continue
        _start(child, children, config, announce, restart=True)
    announce({"event": "stopped"})
    return status_code
