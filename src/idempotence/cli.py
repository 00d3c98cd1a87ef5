"""The ``idempotence`` command.

Every command takes ``--database URL`` (``postgresql://…`` or ``sqlite:///path``),
falling back to ``$IDEMPOTENCE_DATABASE_URL``. Exit status 0 on success, 1 when the
store fails, 2 for a usage error (click's convention).
"""

from __future__ import annotations

import click

from .database import ENV_VAR, DatabaseUrl, open_store
from .errors import IdempotenceError


class _DatabaseUrlType(click.ParamType[DatabaseUrl]):
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


database_option = click.option(
    "--database",
    "database",
    type=_DatabaseUrlType(),
    envvar=ENV_VAR,
    required=True,
    help=f"postgresql://USER@HOST/DB or sqlite:///PATH (default: ${ENV_VAR}).",
)


@click.group()
@click.version_option(package_name="idempotence")
def main() -> None:
    """idempotence: make retries safe."""


@main.command()
@database_option
def migrate(database: DatabaseUrl) -> None:
    """Create or upgrade the key store's tables."""
    try:
        with open_store(database) as store:
            applied = store.migrate()
    except IdempotenceError as exc:
        raise click.ClickException(exc.message) from exc
    if applied:
        click.echo(f"applied {len(applied)} migration(s): {', '.join(applied)}")
    else:
        click.echo("the schema is up to date")
