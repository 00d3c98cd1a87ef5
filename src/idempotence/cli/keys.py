"""The operator's commands: ``keys list|show|evict``, ``stats`` and ``reconcile``
(F5, B5). `idempotence.cli` adds them to the ``idempotence`` command."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

import click

from ..database import ENV_VAR, DatabaseUrl
from ..errors import ConfigurationError, KeyNotFound
from ..maintenance import _format, admin
from ..maintenance.reconcile import (
    Reconciler,
    ReconcilerRegistry,
    parse_since,
    reconcile,
    reconcilers,
)
from ..states import KeyState
from ..stores import Store
from ..stores._redis_url import check_redis_url
from ._shared import (
    DatabaseUrlType,
    ExitStatus,
    ImportType,
    database_option,
    fail,
    fail_on,
    flow_registry,
    flows_option,
    json_option,
    open_cli_key_store,
    redis_prefix_option,
    refuse_redis,
)

DIFFERENCES_FOUND = ExitStatus.DIFFERENCES
"""``reconcile``'s exit status when the two sides differ (0: they agree; 1: the store or
the application's listing failed; 2: usage), so that a scheduled run can alert."""


@click.group()
def keys() -> None:
    """List, show and evict idempotency keys."""


@keys.command("list")
@database_option
@click.option(
    "--state",
    type=click.Choice([s.value for s in KeyState]),
    default=None,
    help="Only keys in this state.",
)
@click.option("--scope", default=None, help="Only keys of this scope (a consumer's name).")
@click.option(
    "--limit",
    type=click.IntRange(1, admin.MAX_LIMIT),
    default=50,
    show_default=True,
    help="Show at most this many keys (the newest).",
)
@redis_prefix_option
@json_option
def list_command(
    database: DatabaseUrl,
    state: str | None,
    scope: str | None,
    limit: int,
    redis_prefix: str | None,
    as_json: bool,
) -> None:
    """Keys, newest first (errored keys wait for a human: --state errored)."""
    with open_cli_key_store(database, redis_prefix) as store:
        rows, more = admin.list_keys_page(
            store, state=KeyState(state) if state else None, scope=scope, limit=limit
        )
    if as_json:
        click.echo(json.dumps([_format.key_json(row) for row in rows]))
    elif rows:
        click.echo(_format.keys_table(rows))
    else:
        click.echo("no keys", err=True)
    if more:
        # On stderr, so that the listing itself (and --json's) stays as it was.
        click.echo(
            f"showing the newest {limit} keys only: there are more "
            f"(pass --limit, up to {admin.MAX_LIMIT}, or filter with --state or --scope)",
            err=True,
        )


@keys.command("show")
@database_option
@click.argument("scope")
@click.argument("key")
@redis_prefix_option
@json_option
def show_command(
    database: DatabaseUrl, scope: str, key: str, redis_prefix: str | None, as_json: bool
) -> None:
    """Every field of one key, its stored response included."""
    with open_cli_key_store(database, redis_prefix) as store:
        row = _found(lambda: admin.show_key(store, scope, key))
    if as_json:
        click.echo(json.dumps(_format.key_json(row, full=True)))
    else:
        click.echo(_format.key_detail(row))


def checked_cache_url(ctx: click.Context, param: click.Parameter, url: str | None) -> str | None:
    """``--cache``, checked as the CachedStore will read it: a usage error now, not a
    tombstone in the wrong database."""
    try:
        return url if url is None else check_redis_url(url)
    except ConfigurationError as exc:
        raise click.BadParameter(exc.message) from None


CACHE_ENV_VAR = "IDEMPOTENCE_CACHE_URL"
"""Where ``keys evict`` finds the Redis cache in front of the database, if any."""


@keys.command("evict")
@database_option
@click.argument("scope")
@click.argument("key")
@click.option("--force", is_flag=True, help="Evict even while a worker holds the key.")
@click.option(
    "--cache",
    envvar=CACHE_ENV_VAR,
    default=None,
    metavar="redis://HOST:PORT/DB",
    callback=checked_cache_url,
    help="The Redis of the CachedStore in front of the database: its cached response "
    f"is refused first (required when there is one). [env: {CACHE_ENV_VAR}]",
)
@click.option(
    "--cache-prefix",
    default="idempotence:cache",
    show_default=True,
    help="The CachedStore's prefix.",
)
@redis_prefix_option
@json_option
def evict_command(
    database: DatabaseUrl,
    scope: str,
    key: str,
    force: bool,
    cache: str | None,
    cache_prefix: str,
    redis_prefix: str | None,
    as_json: bool,
) -> None:
    """Delete one key: its next request runs afresh. A key a worker is running
    right now (a live lock) needs --force, and that worker's writes are refused.
    If a CachedStore serves replays from Redis, pass its --cache: without it the
    cached response would still be replayed until it expires."""
    with open_cli_key_store(database, redis_prefix) as store, contextlib.ExitStack() as stack:
        if cache is not None:
            from ..stores.cached import CachedStore

            if not isinstance(store, Store):
                raise click.UsageError("--cache is for a SQL database behind a CachedStore")
            store = stack.enter_context(CachedStore(store, cache, prefix=cache_prefix))
        row = _found(lambda: admin.evict_key(store, scope, key, force=force))
    if as_json:
        click.echo(json.dumps({"evicted": _format.key_json(row, full=True)}))
        return
    click.echo(f"evicted key {key!r} in scope {scope!r} (it was {row.state.value})")


def _found(get: Any) -> Any:
    try:
        return get()
    except (KeyNotFound, admin.KeyIsLocked) as exc:
        fail_on(exc)


@click.command()
@database_option
@click.option("--scope", default=None, help="Only keys of this scope (a consumer's name).")
@redis_prefix_option
@json_option
def stats(
    database: DatabaseUrl, scope: str | None, redis_prefix: str | None, as_json: bool
) -> None:
    """Keys per state, the oldest pending key's age, and how often a retry took a key
    over from a worker that stopped answering."""
    with open_cli_key_store(database, redis_prefix) as store:
        result = admin.stats(store, scope=scope)
    click.echo(json.dumps(_format.stats_json(result)) if as_json else _format.stats_text(result))


@click.command("reconcile")
@click.argument("flow")
@click.option(
    "--database",
    "database",
    type=DatabaseUrlType(),
    envvar=ENV_VAR,
    default=None,
    help=f"Accepted like every command's (default: ${ENV_VAR}); the reconcilers read "
    "both sides themselves.",
)
@click.option("--since", required=True, help="Window start: 24h, 7d (ago) or ISO 8601.")
@click.option("--until", default=None, help="Window end (default: now).")
@click.option(
    "--reconcilers",
    "registry",
    type=ImportType(),
    default=None,
    help="The application's ReconcilerRegistry (default: the library's).",
)
@flows_option
@json_option
def reconcile_command(
    flow: str,
    database: DatabaseUrl | None,
    since: str,
    until: str | None,
    registry: Any,
    flows: Any,
    as_json: bool,
) -> None:
    """Compare FLOW's local records with the foreign system's over a window:
    foreign records without a local one, and local ones without a foreign one.

    Exit status 3 when there are differences, 0 when the two sides agree."""
    refuse_redis(database)
    try:
        start, end = parse_since(since), parse_since(until) if until else None
    except ConfigurationError as exc:
        raise click.BadParameter(exc.message) from None
    reconciler = _reconciler(flow, registry, flows)
    try:
        result = reconcile(reconciler, start, end, flow=flow)
    except ConfigurationError as exc:
        raise click.BadParameter(exc.message) from None
    except Exception as exc:  # the application's listing failed
        fail(f"reconciling {flow!r} failed: {exc!r}")
    click.echo(_format.to_json(result) if as_json else _format.reconciliation_text(result))
    if not result.clean:
        sys.exit(DIFFERENCES_FOUND)


def _reconciler(flow: str, registry: Any, flows: Any) -> Reconciler:
    """The reconciler registered for ``flow``, or one the flow carries itself
    (a ``reconciler`` attribute)."""
    registry = registry if registry is not None else reconcilers
    if not isinstance(registry, ReconcilerRegistry):
        raise click.BadParameter("must name a ReconcilerRegistry", param_hint="--reconcilers")
    if flow in registry:
        return registry.get(flow)
    found = flow_registry(flows)
    carried = getattr(found.get(flow), "reconciler", None) if flow in found else None
    if isinstance(carried, Reconciler):
        return carried
    try:
        return registry.get(flow)
    except ConfigurationError as exc:
        raise click.UsageError(exc.message) from None
