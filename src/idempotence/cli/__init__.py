"""The ``idempotence`` command.

Every command that reads the store takes ``--database URL`` (``postgresql://…``,
``sqlite:///path`` or ``redis://host:port/db``), falling back to
``$IDEMPOTENCE_DATABASE_URL``. On Redis, ``keys``, ``stats``, ``migrate`` and ``reap``
work (the last two have nothing to do and say so); the commands that need SQL
(``sweep``, ``complete``, ``enqueue``, ``run-jobs``, ``worker``, ``reconcile``) refuse
the URL with the usage status. Tables are for
people; ``--json`` prints JSON for machines.

Exit statuses (`ExitStatus`):

* 0: success;
* 1: the store or the work failed (a schema to migrate, a failed pass, a refused
  eviction, the application's listing);
* 2: a usage or configuration error (an unknown option, a bad URL or argument, a
  missing extra, a server that refuses the URL: a Redis database it does not have);
* 3: ``reconcile`` found differences;
* 4: not found (``keys show`` or ``keys evict`` of a key that does not exist);
* 5: the store is unavailable (refused, unknown host or database, timed out):
  nothing was done, retry later.

Under ``--json`` a failure is one JSON object on stderr (``{"error": ..., "status":
4, "kind": "not_found"}``) and stdout stays empty; usage errors stay text.

::

    idempotence migrate                       create or upgrade the tables
    idempotence worker --flows app:flows      run every background service (B1-B4);
                                              on an async store if a flow is async (F7)
    idempotence sweep | complete | reap | enqueue | run-jobs     one pass of one
    idempotence keys list --state errored     keys by state (F5)
    idempotence keys show SCOPE KEY           one key, every field
    idempotence keys evict SCOPE KEY          delete a key (--force if it is running)
    idempotence stats                         counts per state, oldest pending, takeovers
    idempotence reconcile FLOW --since 24h    local vs foreign records (B5)
    idempotence demo                          Rocket Rides (the ``rocket_rides`` package)
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import click

from .._queries import numbering_gaps
from ..database import DatabaseUrl
from ..errors import ConfigurationError, IdempotenceError
from ..observability import Instrumentation
from ..stores import AsyncStore, Store
from ..stores._sql.ops import pending_migrations
from . import keys as commands
from ._lazy import LazyGroup
from ._shared import (
    ImportType,
    batch_option,
    configure_logging,
    database_option,
    fail_on,
    flow_registry,
    flows_option,
    job_registry,
    jobs_option,
    json_option,
    open_cli_async_store,
    open_cli_key_store,
    open_cli_store,
    require_schema,
)
from ._sinks import NO_RUNNER, SinkChoice, SinkType


@click.group(cls=LazyGroup)
@click.version_option(package_name="idempotence")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default=None,
    help="Log on stderr from this level (default: info for worker, warning otherwise).",
)
@click.option("--log-json", is_flag=True, help="Log one JSON object per line.")
@click.pass_context
def main(ctx: click.Context, log_level: str | None, log_json: bool) -> None:
    """idempotence: make retries safe."""
    default = logging.INFO if ctx.invoked_subcommand == "worker" else logging.WARNING
    configure_logging(log_level, log_json, default)


@main.command()
@database_option
@json_option
def migrate(database: DatabaseUrl, as_json: bool) -> None:
    """Create or upgrade the key store's tables (a Redis store has none)."""
    if not database.sql:
        _redis_nothing_to_do(database, "nothing to migrate: a Redis key store has no schema")
        if as_json:
            click.echo(json.dumps({"applied": []}))
        return
    with open_cli_store(database, create=True) as store:
        try:
            applied = store.migrate()
        except IdempotenceError as exc:
            fail_on(exc)
    if as_json:
        click.echo(json.dumps({"applied": applied}))
    elif applied:
        click.echo(f"applied {len(applied)} migration(s): {', '.join(applied)}")
        # The numbers are shared by every database: say why one is skipped here.
        for gap in numbering_gaps(database.backend, applied):
            click.echo(f"  ({gap})")
    else:
        click.echo("the schema is up to date")


def _redis_nothing_to_do(database: DatabaseUrl, what: str) -> None:
    """Say that a command has nothing to do on Redis, once the server answered (a
    wrong URL still fails, with the unavailable status)."""
    with open_cli_key_store(database) as store:
        try:
            store.get("idempotence", "ping")
        except IdempotenceError as exc:
            fail_on(exc)
    click.echo(what, err=True)


# -- one pass of one service -------------------------------------------------------------


def _one_pass(store: Store, make: Callable[[Store], Any], as_json: bool) -> None:
    service = make(store)
    with _passing(service.name) as progress:
        result = service.run_once(progress=progress)
    _print(service, result, as_json)


def _one_pass_async(
    database: DatabaseUrl, make: Callable[[AsyncStore], Any], as_json: bool
) -> None:
    """`_one_pass` of an async service, on an async store (F7)."""

    async def once() -> None:
        async with open_cli_async_store(database) as store:
            service = make(store)
            with _passing(service.name) as progress:
                result = await service.run_once(progress=progress)
        _print(service, result, as_json)

    asyncio.run(once())


@contextmanager
def _passing(name: str) -> Iterator[Callable[[str, int], None]]:
    """A progress line on a terminal; the library's errors as exit statuses."""
    on_terminal = sys.stderr.isatty()

    def progress(what: str, done: int) -> None:
        if on_terminal:
            click.echo(f"\r{name}: {done} {what}…", nl=False, err=True)

    try:
        yield progress
    except IdempotenceError as exc:
        fail_on(exc, prefix=f"{name} failed: ")
    finally:
        if on_terminal:
            click.echo("\r\033[K", nl=False, err=True)


def _print(service: Any, result: Any, as_json: bool) -> None:
    from ..maintenance._format import to_json

    click.echo(to_json(result) if as_json else service.summary(result))


def _runs_async(registry: Any, forced: bool) -> bool:
    """Whether the completer must run on an async store (F7): asked for, or a
    registered flow has a coroutine phase or foreign call."""
    from ..maintenance._completer_shared import async_flows

    found = async_flows(registry)
    if found:
        logging.getLogger("idempotence.maintenance.worker").info(
            "flows with coroutine steps (%s): running on an async store", ", ".join(found)
        )
    return forced or bool(found)


async_option = click.option(
    "--async",
    "use_async",
    is_flag=True,
    help="Run on an async store, so that async flows and jobs are awaited (the default "
    "when a registered flow has a coroutine phase or foreign call).",
)


def _config(cls: Any, batch_size: int | None, **changes: Any) -> Any:
    if batch_size is not None:
        changes["batch_size"] = batch_size
    try:
        return cls(**changes)
    except ConfigurationError as exc:
        raise click.UsageError(exc.message) from None


@main.command()
@database_option
@batch_option
@json_option
def sweep(database: DatabaseUrl, batch_size: int | None, as_json: bool) -> None:
    """Free the keys whose lock timed out (their worker died or hung), so that a retry
    can take them over; the old worker's late writes are then refused."""
    from ..maintenance import Sweeper, SweeperConfig

    config = _config(SweeperConfig, batch_size)
    with open_cli_store(database) as store:
        _one_pass(store, lambda s: Sweeper(s, config), as_json)


@main.command()
@database_option
@flows_option
@batch_option
@click.option(
    "--grace", type=click.FloatRange(min=0), default=None, help="Seconds a key must be idle."
)
@click.option("--max-attempts", type=click.IntRange(min=1), default=None)
@async_option
@json_option
def complete(
    database: DatabaseUrl,
    flows: Any,
    batch_size: int | None,
    grace: float | None,
    max_attempts: int | None,
    use_async: bool,
    as_json: bool,
) -> None:
    """Finish the keys left half-done (no worker holds them, and no retry came): resume
    each through its flow from its stored parameters (an async flow on an async store)."""
    from ..maintenance import AsyncCompleter, Completer, CompleterConfig

    changes: dict[str, Any] = {}
    if grace is not None:
        changes["grace"] = timedelta(seconds=grace)
    if max_attempts is not None:
        changes["max_attempts"] = max_attempts
    config = _config(CompleterConfig, batch_size, **changes)
    registry = flow_registry(flows)
    if _runs_async(registry, use_async):
        _one_pass_async(database, lambda s: AsyncCompleter(s, config, flows=registry), as_json)
        return
    with open_cli_store(database) as store:
        _one_pass(store, lambda s: Completer(s, config, flows=registry), as_json)


@main.command()
@database_option
@batch_option
@json_option
def reap(database: DatabaseUrl, batch_size: int | None, as_json: bool) -> None:
    """Clear out keys past their retention: an unfinished one gets a stored 408
    (timeout) answer, a finished one is deleted."""
    from ..maintenance import Reaper, ReaperConfig

    if not database.sql:
        _redis_nothing_to_do(
            database,
            "nothing to reap: Redis expires every key itself at the end of its retention (its TTL)",
        )
        if as_json:
            click.echo(json.dumps({"reaped": 0}))
        return
    config = _config(ReaperConfig, batch_size)
    with open_cli_store(database) as store:
        _one_pass(store, lambda s: Reaper(s, config), as_json)


@main.command()
@database_option
@batch_option
@json_option
def enqueue(database: DatabaseUrl, batch_size: int | None, as_json: bool) -> None:
    """Hand the jobs that requests staged and committed to the built-in job runner."""
    from ..maintenance import Enqueuer, EnqueuerConfig

    config = _config(EnqueuerConfig, batch_size)
    with open_cli_store(database) as store:
        _one_pass(store, lambda s: Enqueuer(s, config), as_json)


@main.command("run-jobs")
@database_option
@click.option(
    "--jobs",
    "jobs",
    type=ImportType(),
    required=True,
    help="The application's job registry, e.g. myapp.jobs:registry.",
)
@batch_option
@json_option
def run_jobs(database: DatabaseUrl, jobs: Any, batch_size: int | None, as_json: bool) -> None:
    """Run the built-in job runner's due jobs once."""
    from ..maintenance import JobRunner, JobRunnerConfig

    config = _config(JobRunnerConfig, batch_size)
    registry = job_registry(jobs)
    with open_cli_store(database) as store:
        _one_pass(store, lambda s: JobRunner(s, config, jobs=registry), as_json)


def _served_metrics(port: int | None) -> Instrumentation | None:
    """Prometheus metrics served on ``port`` (none without one)."""
    if port is None:
        return None
    from ..metrics import AVAILABLE

    if not AVAILABLE:
        raise click.UsageError(
            "--metrics-port needs prometheus_client: pip install 'idempotence[metrics]'"
        )
    import prometheus_client

    from ..metrics import PrometheusInstrumentation

    prometheus_client.start_http_server(port)
    # The completer's claims count on the hot-path metrics too.
    return PrometheusInstrumentation()


@main.command()
@database_option
@flows_option
@jobs_option
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds between passes of every service (default: each service's own).",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds a key must be idle before the completer resumes it (default: 300).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (needs idempotence[metrics]).",
)
@click.option(
    "--sink",
    type=SinkType(),
    default=None,
    help="Send staged jobs to RabbitMQ (amqp://...), to a Celery app (myapp.celery:app) "
    "or to a sink of your own (an object with deliver(store, tx, jobs); async def on an "
    "async worker) instead of the built-in job table. While the broker is away the jobs "
    "stay staged and are tried again with a growing pause (0.5 s up to 30 s).",
)
@async_option
def worker(
    database: DatabaseUrl,
    flows: Any,
    jobs: Any,
    interval: float | None,
    grace: float | None,
    metrics_port: int | None,
    sink: SinkChoice | None,
    use_async: bool,
) -> None:
    """Run the sweeper, completer, reaper and enqueuer (and the job runner, with
    --jobs) until SIGTERM or SIGINT; each finishes its current batch first.

    When a registered flow has a coroutine phase or foreign call (or with --async),
    every service runs on an async store on one event loop, so the completer
    resumes async flows and the job runner awaits async jobs."""
    from ..maintenance import (
        AsyncWorker,
        CompleterConfig,
        EnqueuerConfig,
        JobRunnerConfig,
        ReaperConfig,
        SweeperConfig,
        Worker,
        stop_on_signals,
    )

    registry, runner_jobs = flow_registry(flows), job_registry(jobs)
    every: dict[str, Any] = {} if interval is None else {"interval": interval}
    completer = dict(every, **({} if grace is None else {"grace": timedelta(seconds=grace)}))
    configs = {
        "sweeper": _config(SweeperConfig, None, **every),
        "completer": _config(CompleterConfig, None, **completer),
        "reaper": _config(ReaperConfig, None, **every),
        "enqueuer": _config(EnqueuerConfig, None, **every),
        "runner": _config(JobRunnerConfig, None, **every),
    }
    instrumentation = _served_metrics(metrics_port)
    # Said once the store is open and migrated: a worker that cannot start says only why.
    # Through the worker's logger, so that with --log-json it is a JSON line like the rest.
    warn = (
        (lambda: logging.getLogger("idempotence.maintenance.worker").warning(NO_RUNNER))
        if sink is None and runner_jobs is None
        else None
    )
    runs_async = _runs_async(registry, use_async)
    chosen = sink.build(runs_async) if sink is not None else None
    if runs_async:

        async def work() -> None:
            stop = asyncio.Event()
            async with open_cli_async_store(database, instrumentation=instrumentation) as store:
                require_schema(await store._perform(pending_migrations, write=False))
                if warn is not None:
                    warn()
                with stop_on_signals(stop):
                    await AsyncWorker(
                        store, flows=registry, jobs=runner_jobs, sink=chosen, **configs
                    ).run(stop)

        asyncio.run(work())
        return
    stop = threading.Event()
    with open_cli_store(database, instrumentation=instrumentation) as store:
        require_schema(store._perform(pending_migrations, write=False))
        if warn is not None:
            warn()
        with stop_on_signals(stop):
            Worker(store, flows=registry, jobs=runner_jobs, sink=chosen, **configs).run(stop)


# -- the operator's commands (F5, B5) -------------------------------------------------------

main.add_command(commands.keys)
main.add_command(commands.stats)
main.add_command(commands.reconcile_command)
