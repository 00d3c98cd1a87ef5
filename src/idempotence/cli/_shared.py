"""What the CLI's commands share: option types, options, and turning the library's
errors into exit statuses (`ExitStatus`)."""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from enum import IntEnum
from typing import TYPE_CHECKING, Any, NoReturn

import click

from .._backends import examples
from ..database import ENV_VAR, DatabaseUrl, open_async_sql_store, open_sql_store
from ..errors import (
    ConfigurationError,
    IdempotenceError,
    KeyNotFound,
    SchemaMissing,
    StoreUnavailable,
)
from ..flows import Flow, FlowRegistry
from ..logs import StructuredFormatter
from ..maintenance._jobs_shared import JobRegistry
from ..observability import Instrumentation
from ..stores import AsyncStore, Store

if TYPE_CHECKING:
    from ..stores.redis import RedisStore


class ExitStatus(IntEnum):
    """The command's exit statuses, so that a script can tell the failures apart."""

    OK = 0
    FAILED = 1
    """The store or the work failed (a schema to migrate, a pass that failed, a
    refused eviction, the application's listing)."""
    USAGE = 2
    """A usage or configuration error: a bad option, URL or argument (click's
    convention), a missing extra, or a server that refuses the URL."""
    DIFFERENCES = 3
    """``reconcile`` found differences between the two sides."""
    NOT_FOUND = 4
    """The key asked for does not exist (``keys show``, ``keys evict``)."""
    UNAVAILABLE = 5
    """The store cannot be reached (refused, unknown host or database, timed out):
    nothing was done; retry later."""


class DatabaseUrlType(click.ParamType[DatabaseUrl]):
    name = "URL"

    def get_missing_message(self, param: click.Parameter, ctx: click.Context | None) -> str:
        return f"Pass --database URL or set ${ENV_VAR}."

    def convert(self, value: object, param: object, ctx: click.Context | None) -> DatabaseUrl:
        if isinstance(value, DatabaseUrl):
            return value
        try:
            return DatabaseUrl.parse(str(value))
        except IdempotenceError as exc:
            # One line, as every other error of the command: click's usage form would
            # add two lines about --help to a URL that may come from the environment.
            raise CommandFailed(exc.message, ExitStatus.USAGE) from None


class ImportType(click.ParamType[Any]):
    """``module:attribute``, imported (from the working directory too, as a console
    script does not put it on ``sys.path``)."""

    name = "MODULE:ATTRIBUTE"

    def convert(self, value: object, param: object, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        module_name, sep, attribute = value.partition(":")
        if not sep or not module_name or not attribute:
            self.fail(f"{value!r} is not MODULE:ATTRIBUTE (for example myapp.tasks:flows)")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            found: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError) as exc:
            self.fail(f"cannot import {value!r}: {exc}")
        return found


database_option = click.option(
    "--database",
    "database",
    type=DatabaseUrlType(),
    envvar=ENV_VAR,
    required=True,
    help=f"{examples()} (default: ${ENV_VAR}).",
)
REDIS_PREFIX_ENV_VAR = "IDEMPOTENCE_REDIS_PREFIX"
"""The key prefix of a Redis store opened with ``RedisStore(prefix=...)``."""
redis_prefix_option = click.option(
    "--redis-prefix",
    envvar=REDIS_PREFIX_ENV_VAR,
    default=None,
    metavar="PREFIX",
    help="The key prefix of a redis:// database's store, when it was opened with "
    f"RedisStore(prefix=...) (default: idempotence). [env: {REDIS_PREFIX_ENV_VAR}]",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
batch_option = click.option(
    "--batch-size", type=click.IntRange(min=1), default=None, help="Rows per batch."
)
flows_option = click.option(
    "--flows",
    "flows",
    type=ImportType(),
    default=None,
    help="The application's flow registry (or a flow), e.g. myapp.flows:registry.",
)
jobs_option = click.option(
    "--jobs",
    "jobs",
    type=ImportType(),
    default=None,
    help="The application's job registry, e.g. myapp.jobs:registry.",
)


class CommandFailed(click.ClickException):
    """A failure reported as one line on stderr, with its own exit status."""

    def __init__(self, message: str, status: ExitStatus = ExitStatus.FAILED) -> None:
        super().__init__(message)
        self.status = status
        # Under --json the error is for a machine too; the context is gone by the
        # time click shows the error, so ask it now.
        ctx = click.get_current_context(silent=True)
        self.as_json = bool(ctx is not None and ctx.params.get("as_json"))

    def show(self, file: Any = None) -> None:
        if not self.as_json:
            super().show(file)
            return
        error = {
            "error": self.message,
            "status": int(self.status),
            "kind": self.status.name.lower(),
        }
        click.echo(json.dumps(error), file=file, err=True)

    @property  # click reads exit_code, a class attribute on ClickException
    def exit_code(self) -> int:  # type: ignore[override]
        return int(self.status)


def fail(message: str, status: ExitStatus = ExitStatus.FAILED) -> NoReturn:
    raise CommandFailed(message, status)


def status_of(exc: IdempotenceError) -> ExitStatus:
    """The exit status for one of the library's errors."""
    if isinstance(exc, KeyNotFound):
        return ExitStatus.NOT_FOUND
    # Before StoreUnavailable: a server that refuses the URL (StoreMisconfigured) is
    # both, and no retry cures it.
    if isinstance(exc, ConfigurationError):
        return ExitStatus.USAGE
    if isinstance(exc, StoreUnavailable):
        return ExitStatus.UNAVAILABLE
    return ExitStatus.FAILED


def fail_on(exc: IdempotenceError, prefix: str = "") -> NoReturn:
    """Exit with ``exc``'s message, on one line, and its status."""
    fail(prefix + " ".join(part.strip() for part in exc.message.splitlines()), status_of(exc))


def _reachable(database: DatabaseUrl, create: bool) -> None:
    """Check, before the store opens, what it would report late or obscurely: the probe
    of the URL's backend (`_PROBES`), if it has one. A backend without one (MariaDB:
    its store's first connection fails at once, with the driver's reason) is opened as
    it is."""
    probe = _PROBES.get(database.backend)
    if probe is not None:
        probe(database, create)


def _sqlite_file(database: DatabaseUrl, create: bool) -> None:
    """The file must exist (unless ``create``: migrate), in a directory that does."""
    if database.target == ":memory:":
        return
    # sqlite3 would create an empty file, which no command but migrate wants.
    if not create and not os.path.exists(database.target):
        raise StoreUnavailable(
            f"the SQLite database {database.target} does not exist: "
            "`idempotence migrate --database URL` creates it"
        )
    # sqlite3 creates the file, never its directory, and says only "unable to
    # open database file".
    folder = os.path.dirname(os.path.abspath(database.target))
    if not os.path.isdir(folder):
        raise ConfigurationError(
            f"the directory {folder} does not exist: create it, or fix the path in "
            "the sqlite:/// URL"
        )


def _postgres_server(database: DatabaseUrl, create: bool) -> None:
    """Connect once before opening the store's pool: a refused connection fails at
    once with libpq's reason, where the pool would retry for its whole timeout, logging
    each attempt, and then report only that it timed out."""
    require_driver(database)
    import psycopg

    from ..stores.postgres import DEFAULT_CONNECT_TIMEOUT, translate

    try:
        psycopg.connect(database.target, connect_timeout=int(DEFAULT_CONNECT_TIMEOUT)).close()
    except psycopg.ProgrammingError as exc:
        # libpq refused the URL itself (a malformed one, an unknown option); its
        # message quotes the whole URL, password included: leave that part out.
        reason = re.sub(r'\s*in URI: ".*"\s*$', "", str(exc).strip(), flags=re.DOTALL)
        raise ConfigurationError(f"invalid PostgreSQL URL: {reason}") from exc
    except psycopg.Error as exc:
        raise translate(exc) from exc


_PROBES: dict[str, Callable[[DatabaseUrl, bool], None]] = {
    "sqlite": _sqlite_file,
    "postgres": _postgres_server,
}
"""What the CLI checks before it opens a store, by backend (``DatabaseUrl.backend``)."""


@contextmanager
def open_cli_store(
    database: DatabaseUrl, *, instrumentation: Instrumentation | None = None, create: bool = False
) -> Iterator[Store]:
    """The store, with the library's errors turned into exit statuses; a SQLite file
    that does not exist is refused unless ``create`` (migrate), a Redis URL with the
    usage status (the command needs SQL)."""
    refuse_redis(database)
    try:
        _reachable(database, create)
        with open_sql_store(database, instrumentation=instrumentation) as store:
            yield store
    except IdempotenceError as exc:
        fail_on(exc)


@asynccontextmanager
async def open_cli_async_store(
    database: DatabaseUrl, *, instrumentation: Instrumentation | None = None, create: bool = False
) -> AsyncIterator[AsyncStore]:
    """The async store (F7), with the library's errors turned into exit statuses."""
    refuse_redis(database)
    try:
        _reachable(database, create)
        async with open_async_sql_store(database, instrumentation=instrumentation) as store:
            yield store
    except IdempotenceError as exc:
        fail_on(exc)


def refuse_redis(database: DatabaseUrl | None) -> None:
    """A command that needs SQL (the maintenance services, reconcile) refuses a
    Redis URL in one line, with the usage status."""
    if database is not None and not database.sql:
        ctx = click.get_current_context(silent=True)
        command = f"`{ctx.command_path}`" if ctx is not None else "this command"
        fail(
            f"{command} needs a SQL database ({examples(sql=True)}): a Redis key "
            "store has no flows, staged jobs or tables for it to work on",
            ExitStatus.USAGE,
        )


@contextmanager
def open_cli_key_store(
    database: DatabaseUrl, redis_prefix: str | None = None
) -> Iterator[Store | RedisStore]:
    """Any store, SQL or Redis, for the commands that only read and evict keys; a
    Redis store under ``redis_prefix`` if given."""
    if database.sql:
        if redis_prefix is not None:
            fail("--redis-prefix is for a redis:// database", ExitStatus.USAGE)
        with open_cli_store(database) as store:
            yield store
        return
    require_driver(database)
    from ..stores.redis import DEFAULT_PREFIX, RedisStore

    try:
        opened = RedisStore(database.target, prefix=redis_prefix or DEFAULT_PREFIX)
    except ConfigurationError as exc:
        fail(exc.message, ExitStatus.USAGE)
    except IdempotenceError as exc:
        fail_on(exc)
    try:
        with opened as store:
            yield store
    except IdempotenceError as exc:
        fail_on(exc)


def require_driver(database: DatabaseUrl) -> None:
    """A URL whose backend's extra is not installed fails in one line that
    names the extra, with the usage status, instead of an import traceback."""
    try:
        database.check_driver()
    except ConfigurationError as exc:
        fail(exc.message, ExitStatus.USAGE)


def require_schema(pending: list[str]) -> None:
    """Refuse to start on a schema that lacks migrations (``pending``): a long-running
    command would otherwise fail every pass, a fault no retry cures."""
    if pending:
        raise SchemaMissing(
            f"The key store's schema lacks migration(s) {', '.join(pending)}: "
            "run `idempotence migrate --database URL`"
        )


def flow_registry(value: Any) -> FlowRegistry:
    from ..flows import flows as default_flows

    if value is None:
        return default_flows
    if isinstance(value, FlowRegistry):
        return value
    registry = FlowRegistry()
    try:
        for flow in [value] if isinstance(value, Flow) else list(value):
            if not isinstance(flow, Flow):
                raise TypeError
            registry.register(flow)
    except (TypeError, ConfigurationError):
        raise click.BadParameter(
            "must name a FlowRegistry, a Flow or a list of flows", param_hint="--flows"
        ) from None
    return registry


def job_registry(value: Any) -> JobRegistry | None:
    if value is not None and not isinstance(value, JobRegistry):
        raise click.BadParameter("must name a JobRegistry", param_hint="--jobs")
    return value


def configure_logging(level: str | None, as_json: bool, default: int) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(StructuredFormatter(as_json=as_json))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()) if level else default)
