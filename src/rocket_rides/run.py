"""The demo's main job: start the service, hammer it through crashes, reconcile.

1. Start the stack (`stack`) in a process of its own: the provider, the API
   workers (chaos enabled) and the background worker, on free ports of 127.0.0.1;
   with ``--broker``, the receipt consumers too, on a queue of the run's own
   (`broker`).
2. Run the simulated clients (`clients`): every ride retried until it has an
   answer, some requests ordering the worker that handles them to die.
3. Wait for the dust to settle: every key terminal, every receipt sent (and, with a
   broker, every message published settled by a consumer).
4. Gather the evidence from our database, the provider's API and the mailer (or the
   consumers' receipts and the broker ledger), and check it (`report`).

Everything started here is stopped here, whatever happens: the stack runs in a
process group of its own, which is killed whole at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from idempotence.database import DatabaseUrl, open_sql_store
from idempotence.errors import KeyNotFound
from idempotence.maintenance import KeyRow, show_key
from idempotence.testing.provider import Charge

from .clients import ClientStats, Workload, make_workload, run_clients
from .mailer import FakeMailer, Receipt
from .provider import Faults
from .report import TERMINAL, Evidence, MessageCounts, Report, RideRow, assess
from .schema import fetch
from .stack import StackConfig

__all__ = [
    "DemoError",
    "DemoOptions",
    "StackProcess",
    "free_port",
    "rerun_command",
    "run_demo",
    "start_stack",
]

START_TIMEOUT = 30.0
"""How long the processes get to start, and the run to settle after the clients."""
SETTLE_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """The demo's knobs (see ``idempotence demo --help``)."""

    rides: int = 200
    clients: int = 8
    workers: int = 3
    crash_rate: float = 0.1
    provider_faults: float = 0.02
    declined_rate: float = 0.1
    abandon_rate: float = 0.05
    database: str | None = None
    """None: SQLite in the data directory."""
    seed: int | None = None
    data_dir: str | None = None
    """None: a temporary directory, removed at the end."""
    lock_timeout: float = 1.0
    broker: str | None = None
    """amqp://…: send the receipts through RabbitMQ to guarded consumers."""
    duplicate_rate: float = 0.3
    """With a broker: the share of receipts published twice on purpose."""


def rerun_command(options: DemoOptions, seed: int) -> str:
    """The command that runs ``options``' workload again: the options that differ
    from the defaults, and the seed (what the clients do, and when they crash their
    worker, follows from it; the timing of the processes does not). A password in a
    URL is left out: ``PASSWORD`` stands in for it.

    Example:
        ```python
        rerun_command(DemoOptions(rides=20, workers=1), seed=7)
        # "idempotence demo --rides 20 --workers 1 --seed 7"
        ```
    """
    words = ["idempotence", "demo"]
    defaults = DemoOptions()
    for field in dataclasses.fields(DemoOptions):
        value = getattr(options, field.name)
        if field.name in ("seed", "data_dir") or value == getattr(defaults, field.name):
            continue
        if isinstance(value, str):
            value = _without_password(value)
        words += ["--" + field.name.replace("_", "-"), str(value)]
    return shlex.join([*words, "--seed", str(seed)])


def _without_password(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return parts._replace(netloc=f"{user.partition(':')[0]}:PASSWORD@{host}").geturl()


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class StackProcess:
    """The stack's supervisor process, and what it reports on its stdout."""

    def __init__(self, config: StackConfig, log: IO[bytes]) -> None:
        self.config = config
        self.crashes = 0
        self.consumer_crashes = 0
        self.restarts = 0
        self.failed: str | None = None
        #: The current pid of each child, by name (``api:PORT``, ``provider:PORT``,
        #: ``worker``), updated as the supervisor restarts them (the soak run reads it).
        self.pids: dict[str, int] = {}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rocket_rides", "stack", "--config", config.to_json()],
            stdout=subprocess.PIPE,
            stderr=log,
            # A group of its own: stop() can kill every process of the stack at once,
            # and a Ctrl-C in our terminal reaches us, who then stop it in order.
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        # The only writer of the counters: the run reads them once it is over.
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event["event"] == "exited" and event.get("signal") == signal.SIGKILL:
                if event["role"] == "api":
                    self.crashes += 1
                elif event["role"] == "consumer":
                    self.consumer_crashes += 1
            elif event["event"] == "started":
                if event.get("restart"):
                    self.restarts += 1
                role, port = event["role"], event["port"]
                self.pids[role if port is None else f"{role}:{port}"] = event["pid"]
            elif event["event"] == "failed":
                self.failed = event["role"]

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM the supervisor (it stops its children), then kill the group."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(15)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._reader.join(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()


class DemoError(Exception):
    """The demo could not run (as opposed to: it ran and found a defect)."""


def _wait_ready(stack: StackProcess, urls: list[str], log: IO[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    pending = list(urls)
    with httpx.Client(timeout=1.0) as http:
        while pending:
            if not stack.alive() or stack.failed or time.monotonic() > deadline:
                raise DemoError(
                    f"the demo's processes did not start ({stack.failed or pending[0]});"
                    f" their log ends with:\n{_tail(log)}"
                )
            try:
                if http.get(pending[0] + "/healthz").status_code == 200:
                    pending.pop(0)
                    continue
            except httpx.TransportError:
                pass
            time.sleep(0.05)


def _tail(log: IO[bytes], lines: int = 20) -> str:
    log.flush()
    with open(log.name, "rb") as again:
        text = again.read().decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def start_stack(config: StackConfig, log: IO[bytes]) -> Iterator[StackProcess]:
    """Start the stack, wait until every server answers, and stop it all at the end."""
    stack = StackProcess(config, log)
    try:
        urls = [config.provider_url] + [f"http://{config.host}:{p}" for p in config.api_ports]
        _wait_ready(stack, urls, log)
        yield stack
    finally:
        stack.stop()


# -- the run ----------------------------------------------------------------------------------


def run_demo(
    options: DemoOptions,
    progress: Callable[[], None] | None = None,
    begin: Callable[[], None] | None = None,
) -> Report:
    """Run the demo and return its report; ``begin()`` is called once the services
    are up and the clients start, ``progress()`` as each ride ends."""
    started = time.monotonic()
    seed = options.seed if options.seed is not None else secrets.randbelow(2**31)
    own_dir = options.data_dir is None
    data_dir = options.data_dir or tempfile.mkdtemp(prefix="rocket-rides-")
    try:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        database = options.database or f"sqlite:///{Path(data_dir).resolve()}/rides.sqlite3"
        # A run id in every key keeps runs apart on a database that outlives them.
        workload = make_workload(
            run=secrets.token_hex(3),
            rides=options.rides,
            clients=options.clients,
            crash_rate=options.crash_rate,
            declined_rate=options.declined_rate,
            seed=seed,
            abandon_rate=options.abandon_rate,
        )
        with contextlib.ExitStack() as cleanup:
            queue = _queue(options, cleanup)
            config = _stack_config(options, database, data_dir, seed, queue)
            log = cleanup.enter_context(open(Path(data_dir) / "processes.log", "wb"))
            stack = cleanup.enter_context(start_stack(config, log))
            urls = [f"http://127.0.0.1:{port}" for port in config.api_ports]
            if begin is not None:
                begin()
            clients = asyncio.run(run_clients(workload, urls, progress))
            _settle(database, workload, config, clients)
            evidence = _gather(database, workload, config, clients)
            messages = _messages(config, stack)
            crashes, restarts = stack.crashes, stack.restarts
        settings: dict[str, Any] = {
            "backend": DatabaseUrl.parse(database).backend,
            "clients": options.clients,
            "workers": options.workers,
            "crash_rate": options.crash_rate,
            "provider_faults": options.provider_faults,
            "seed": seed,
            "rerun": rerun_command(options, seed),
        }
        if queue is not None:
            settings["broker_queue"] = queue
        return assess(
            Evidence(
                **evidence,
                crashes=crashes,
                restarts=restarts,
                wall_time=time.monotonic() - started,
                settings=settings,
                messages=messages,
            )
        )
    finally:
        if own_dir:
            shutil.rmtree(data_dir, ignore_errors=True)


def _queue(options: DemoOptions, cleanup: contextlib.ExitStack) -> str | None:
    """With a broker: the run's own queue on it, deleted at the end by ``cleanup``."""
    if options.broker is None:
        return None
    from .broker import BrokerUnavailable, run_queue

    try:
        return cleanup.enter_context(run_queue(options.broker))
    except BrokerUnavailable as exc:
        raise DemoError(str(exc)) from exc


def _stack_config(
    options: DemoOptions, database: str, data_dir: str, seed: int, queue: str | None
) -> StackConfig:
    broker = None
    if options.broker is not None and queue is not None:
        from .broker import BrokerConfig

        broker = BrokerConfig(
            url=options.broker,
            queue=queue,
            crash_rate=options.crash_rate,
            duplicate_rate=options.duplicate_rate,
        )
    return StackConfig(
        database=database,
        data_dir=data_dir,
        api_ports=tuple(free_port() for _ in range(options.workers)),
        provider_port=free_port(),
        chaos=True,
        lock_timeout=options.lock_timeout,
        # The completer is for keys whose client walked away; the grace keeps it
        # from racing the clients that are still retrying (it would be safe, only
        # wasteful).
        completer_grace=options.lock_timeout + 1.0,
        service_interval=0.5,
        faults=Faults(
            latency=0.01,
            fail_before_commit=options.provider_faults,
            drop_after_commit=options.provider_faults,
            server_error=options.provider_faults,
        ),
        seed=seed,
        broker=broker,
    )


def _messages(config: StackConfig, stack: StackProcess) -> MessageCounts | None:
    if config.broker is None:
        return None
    from .broker import Ledger, tally

    return tally(Ledger(config.data_dir).events(), consumers_killed=stack.consumer_crashes)


def _keys(database: str, workload: Workload) -> dict[str, KeyRow | None]:
    rows: dict[str, KeyRow | None] = {}
    with open_sql_store(database) as store:
        for ride in workload.rides:
            try:
                rows[ride.key] = show_key(store, ride.scope, ride.key)
            except KeyNotFound:
                rows[ride.key] = None
    return rows


def _state(row: KeyRow | None) -> str:
    return "missing" if row is None else row.state.value


def _rides(database: str, workload: Workload) -> list[RideRow]:
    with open_sql_store(database) as store, store.transaction() as tx:
        rows = fetch(
            tx,
            "SELECT id, request_key, status, charge_id FROM rocket_rides"
            " WHERE request_key LIKE :prefix ORDER BY id",
            {"prefix": workload.key_prefix + "%"},
        )
    return [RideRow(**row) for row in rows]


def _receipts(config: StackConfig, rides: list[RideRow]) -> list[Receipt]:
    ride_ids = {ride.id for ride in rides}
    if config.broker is not None:
        from .broker import receipts

        return receipts(config.database, ride_ids)
    return [r for r in FakeMailer(config.mailer_path).receipts() if r.ride_id in ride_ids]


def _settle(database: str, workload: Workload, config: StackConfig, clients: ClientStats) -> None:
    """Wait until every key is terminal and every paid ride has its receipt: the
    completer finishes what clients gave up on, the job runner sends the receipts.
    Past the deadline, the reconciliation reports whatever is still missing."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    # A client that walked away before its key was claimed left no key to wait for.
    abandoned = set(clients.abandoned)
    while time.monotonic() < deadline:
        keys = _keys(database, workload)
        settled = (
            _state(row) in TERMINAL or (row is None and key in abandoned)
            for key, row in keys.items()
        )
        if all(settled):
            rides = _rides(database, workload)
            paid = {ride.id for ride in rides if ride.status == "charged"}
            receipts = {receipt.ride_id for receipt in _receipts(config, rides)}
            if paid <= receipts and _messages_settled(config, paid):
                return
        time.sleep(0.25)


def _messages_settled(config: StackConfig, paid: set[int]) -> bool:
    """With a broker: every paid ride's receipt was published, and every copy
    published (duplicates included) was settled by a consumer."""
    if config.broker is None:
        return True
    from .broker import Ledger, tally

    counts = tally(Ledger(config.data_dir).events())
    return paid <= counts.rides_published and counts.unsettled == 0


def _gather(
    database: str, workload: Workload, config: StackConfig, clients: ClientStats
) -> dict[str, Any]:
    rides = _rides(database, workload)
    with httpx.Client(base_url=config.provider_url, timeout=10.0) as http:
        data = http.get("/v1/charges").raise_for_status().json()["data"]
    # A charge's reference is "<scope>/<key>": this run's charges are its keys'.
    mine = [
        c for c in data if (c["reference"] or "").rpartition("/")[2].startswith(workload.key_prefix)
    ]
    keys = _keys(database, workload)
    found = [row for row in keys.values() if row is not None]
    return {
        "requested": workload.rides,
        "rides": rides,
        "charges": [Charge(**c) for c in mine],
        "receipts": _receipts(config, rides),
        "key_states": {key: _state(row) for key, row in keys.items()},
        # Every claim that took a key over (after a crash) bumped its fencing token.
        "takeovers": sum(row.record.lock_token - 1 for row in found),
        "completer_resumed": sum(1 for row in found if row.completer_attempts > 0),
        "clients": clients,
    }
