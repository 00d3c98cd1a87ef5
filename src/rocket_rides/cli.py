"""``idempotence demo``: prove exactly-once under crashes; ``demo serve``: try it by hand.

The ``idempotence`` command loads this group by name when ``idempotence demo`` runs
(the library never imports the demo); ``python -m rocket_rides`` runs the same group
on its own.

The demo needs Starlette, uvicorn and httpx, which the library itself does not: this
module imports them only when a demo command runs, so that registering the group costs
the ``idempotence`` command nothing, and a missing one is a message, not a traceback.
"""

from __future__ import annotations

import functools
import json
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from idempotence.cli._shared import ExitStatus, fail
from idempotence.database import DatabaseUrl
from idempotence.errors import ConfigurationError

if TYPE_CHECKING:
    from .stack import Event

__all__ = ["demo"]

_NEEDS = (("starlette", "starlette"), ("uvicorn", "uvicorn"), ("httpx", "httpx"))
"""What the demo needs beyond the library: (module, distribution)."""


_NEEDS_BROKER = (("pika", "pika"), ("aio_pika", "aio-pika"))
"""What ``--broker`` needs on top."""


def _require_dependencies(broker: bool = False) -> None:
    import importlib.util

    needs = _NEEDS + _NEEDS_BROKER if broker else _NEEDS
    missing = [dist for module, dist in needs if importlib.util.find_spec(module) is None]
    if missing:
        # The extras, not the distributions: they pin the versions the demo runs on.
        extras = "demo,rabbitmq" if broker else "demo"
        fail(
            f"the demo needs {', '.join(missing)}: pip install 'idempotence[{extras}]'",
            ExitStatus.USAGE,
        )


def _database(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        url = DatabaseUrl.parse(value)
        url.check_driver()
    except ConfigurationError as exc:
        raise click.BadParameter(exc.message) from exc
    if not url.sql:
        raise click.BadParameter(
            "the demo needs a SQL database (postgresql:// or sqlite:///): its rides, "
            "charges and flows live in the key store's database"
        )
    return value


def _broker(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.startswith(("amqp://", "amqps://")):
        raise click.BadParameter("give an AMQP URL: amqp://user:password@host:5672/")
    return value


database_option = click.option(
    "--database",
    default=None,
    callback=_database,
    metavar="URL",
    help="postgresql://… or sqlite:///… (default: SQLite in the data directory).",
)
"""Both commands take the database the same way."""


@click.group(invoke_without_command=True)
@click.option("--rides", default=200, show_default=True, type=click.IntRange(1, 100_000))
@click.option(
    "--clients",
    default=8,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Simulated clients booking rides at once.",
)
@click.option(
    "--workers",
    default=3,
    show_default=True,
    type=click.IntRange(1, 32),
    help="API worker processes, each on its own port.",
)
@click.option(
    "--crash-rate",
    default=0.1,
    show_default=True,
    type=click.FloatRange(0.0, 0.9),
    help="Probability per request that the API worker handling it is SIGKILLed (and, with"
    " --broker, per message that the consumer handling it is).",
)
@click.option(
    "--provider-faults",
    default=0.02,
    show_default=True,
    type=click.FloatRange(0.0, 0.3),
    help="Rate of each provider fault: drop before commit, drop after commit, 500.",
)
@click.option(
    "--declined-rate",
    default=0.1,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="Share of rides by riders whose card is declined.",
)
@database_option
@click.option(
    "--abandon-rate",
    default=0.05,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="Probability that a client walks away after a failed attempt (the completer then"
    " finishes its ride).",
)
@click.option(
    "--lock-timeout",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.5, 60.0),
    help="Seconds a killed worker keeps its key locked before a retry may take it over.",
)
@click.option(
    "--broker",
    default=None,
    callback=_broker,
    metavar="URL",
    help="amqp://…: send the receipts through RabbitMQ to guarded consumers, which are"
    " killed mid-message at the crash rate (default: no broker, receipts by the mailer).",
)
@click.option(
    "--duplicate-rate",
    default=0.3,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="With --broker: share of receipts published twice on purpose.",
)
@click.option("--seed", type=int, default=None, help="Make the workload reproducible.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the SQLite files and process logs here (default: a temporary directory).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.pass_context
def demo(ctx: click.Context, /, **options: Any) -> None:
    """Rocket Rides: run a ride-booking service through crashes and prove that every
    ride was charged exactly once.

    Starts a fake payment provider, several API workers and the background worker;
    simulated clients book rides and retry through dropped connections, 409s and 5xx,
    while API workers are SIGKILLed mid-request and restarted. With --broker, receipts
    go through RabbitMQ to guarded consumers, killed mid-message, some published twice.
    Then rides, charges and receipts are reconciled. Exit status 0 only if every
    invariant holds.
    """
    if ctx.invoked_subcommand is not None:
        return
    _require_dependencies(broker=options["broker"] is not None)
    from .progress import Progress
    from .run import DemoError, DemoOptions, run_demo
    from .summary import render

    as_json = options.pop("as_json")
    data_dir = options.pop("data_dir")
    settings = DemoOptions(**options, data_dir=None if data_dir is None else str(data_dir))
    # The progress goes to stderr, so that --json output stays one object on stdout.
    progress = Progress(
        settings.rides, tty=sys.stderr.isatty(), write=lambda line: click.echo(line, err=True)
    )
    try:
        report = run_demo(settings, progress=progress, begin=progress.begin)
    except DemoError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        progress.end()
    if as_json:
        click.echo(json.dumps(report.to_json(), sort_keys=True))
    else:
        click.echo(render(report))
    ctx.exit(0 if report.ok else 1)


@demo.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--provider-port", default=8001, show_default=True, type=click.IntRange(1, 65535))
@database_option
@click.option(
    "--profile",
    type=click.Choice(["ietf", "stripe"]),
    default="ietf",
    show_default=True,
    help='Error bodies: RFC 9457 problems, or Stripe\'s {"error": …}.',
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the SQLite files go (default: a temporary directory, removed on exit).",
)
@click.option(
    "--provider-faults",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0.0, 0.3),
    help="Rate of each provider fault.",
)
@click.option(
    "--provider-latency",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0.0, 10.0),
    help="Seconds each charge takes (between half of it and all of it): time to race a twin.",
)
def serve(
    host: str,
    port: int,
    provider_port: int,
    database: str | None,
    profile: str,
    data_dir: Path | None,
    provider_faults: float,
    provider_latency: float,
) -> None:
    """Run the Rocket Rides API, the fake provider and the background worker.

    For trying the API by hand: curl examples are on http://127.0.0.1:8000/docs.
    Crash orders (X-Demo-Crash) are never honoured here. Stop with Ctrl-C.
    """
    _require_dependencies()
    from .provider import Faults
    from .stack import StackConfig, run_stack

    own = data_dir is None
    directory = Path(tempfile.mkdtemp(prefix="rocket-rides-")) if data_dir is None else data_dir
    directory.mkdir(parents=True, exist_ok=True)
    url = database or f"sqlite:///{directory.resolve()}/rides.sqlite3"
    config = StackConfig(
        database=url,
        data_dir=str(directory),
        api_ports=(port,),
        provider_port=provider_port,
        host=host,
        profile=profile,
        faults=Faults(
            latency=provider_latency,
            fail_before_commit=provider_faults,
            drop_after_commit=provider_faults,
            server_error=provider_faults,
        ),
        log_level="info",
    )
    for option, number in (("--port", port), ("--provider-port", provider_port)):
        if not _free(host, number):
            raise click.ClickException(
                f"port {number} on {host} is in use: choose another {option}"
            )

    def banner() -> None:
        echo = functools.partial(click.echo, err=True)
        echo(f"Rocket Rides API   http://{host}:{port}   (docs: http://{host}:{port}/docs)")
        echo(f"FakePay provider   http://{host}:{provider_port}/v1/charges")
        echo(f"database           {url}")
        echo(f"provider, mailer   {directory}")
        echo("API keys           user-1 … user-100 (user-N-declined: a declined card)")
        echo("Stop with Ctrl-C.")

    def announce(event: Event) -> None:
        # The banner once the servers accept connections; a process that dies while
        # the stack stops (Ctrl-C, SIGTERM) was told to.
        if event["event"] == "ready":
            banner()
        elif event["event"] == "exited" and event.get("signal") and not event.get("stopping"):
            click.echo(
                f"{event['role']} (pid {event['pid']}) died: signal {event['signal']}", err=True
            )
        elif event["event"] == "failed":
            click.echo(f"{event['role']} failed to start: see the line above", err=True)

    try:
        status = run_stack(config, announce)
    finally:
        if own:
            shutil.rmtree(directory, ignore_errors=True)
    sys.exit(status)


def _free(host: str, port: int) -> bool:
    """Whether ``port`` can be listened on (a server already there would make the
    stack's process fail to start, again and again)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@demo.command(hidden=True)
@click.option("--config", "config_json", required=True)
def stack(config_json: str) -> None:
    """Run the stack for the demo's orchestrator, reporting in JSON lines."""
    from .stack import StackConfig, run_stack

    def announce(event: Event) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    sys.exit(run_stack(StackConfig.from_json(config_json), announce))
