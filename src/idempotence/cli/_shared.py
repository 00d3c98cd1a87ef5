"""What the CLI's commands share: option types, options, and turning the library's
errors into exit statuses (1: the store or the work failed; 2: a usage error)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, NoReturn

import click

from ..database import ENV_VAR, DatabaseUrl, open_async_store, open_store
from ..errors import ConfigurationError, IdempotenceError
from ..flows import Flow, FlowRegistry
from ..maintenance._jobs import JobRegistry
from ..maintenance.logs import StructuredFormatter
from ..observability import Instrumentation
from ..stores import AsyncStore, Store


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
            self.fail(exc.message)


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
    help=f"postgresql://USER@HOST/DB or sqlite:///PATH (default: ${ENV_VAR}).",
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


def fail(message: str) -> NoReturn:
    raise click.ClickException(message)


@contextmanager
def open_cli_store(
    database: DatabaseUrl, *, instrumentation: Instrumentation | None = None
) -> Iterator[Store]:
    """The store, with the library's errors turned into exit status 1."""
    try:
        with open_store(database, instrumentation=instrumentation) as store:
            yield store
    except IdempotenceError as exc:
        fail(exc.message)


@asynccontextmanager
async def open_cli_async_store(
    database: DatabaseUrl, *, instrumentation: Instrumentation | None = None
) -> AsyncIterator[AsyncStore]:
    """The async store (F7), with the library's errors turned into exit status 1."""
    try:
        async with open_async_store(database, instrumentation=instrumentation) as store:
            yield store
    except IdempotenceError as exc:
        fail(exc.message)


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
