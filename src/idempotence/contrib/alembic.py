"""Alembic: the key tables from ``alembic upgrade``, built by the library's own
migrations (the canonical ``sql/*/migrations``), so they cannot drift from what the
stores expect.

A revision of the application's calls [`migrate`][idempotence.contrib.alembic.migrate];
it applies, in Alembic's transaction, the library migrations the database lacks, and
records them as ``idempotence migrate`` does (so either can run, in any order, and the
stores' schema check passes). After an upgrade of the library, a new revision that calls
it again brings the tables up to date::

    # migrations/versions/0002_idempotency_keys.py
    from alembic import op
    from idempotence.contrib import alembic as idempotence

    def upgrade() -> None:
        idempotence.migrate(op)

    def downgrade() -> None:
        idempotence.drop(op)

In ``env.py``, pass ``include_name=idempotence.include_name`` to
``context.configure(...)`` (or call it from your own hook), so that
``alembic revision --autogenerate`` leaves the key tables alone rather than proposing
to drop them. PostgreSQL (psycopg 3) and SQLite; online migrations only (the
migrations to run depend on what the database has).
"""

from __future__ import annotations

import re
from typing import Any

from .. import _queries
from ..errors import ConfigurationError
from ..stores.sql import Query, run
from ..stores.sql import migrate as migrate_op
from ._sqlalchemy import _SqlConnection
from ._sqlalchemy_shared import dialect_for

__all__ = ["drop", "include_name", "migrate", "tables"]

MIGRATIONS_TABLE = "idempotence_migrations"


def tables(dialect: str = "postgres") -> list[str]:
    """The library's tables on ``dialect`` (``"postgres"`` or ``"sqlite"``), the
    migrations' bookkeeping table last."""
    found = re.findall(r"^CREATE TABLE (\w+)", _queries.schema(dialect), re.MULTILINE)
    return [*found, MIGRATIONS_TABLE]


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Alembic's ``include_name`` hook: everything but the library's tables (and
    their indexes), which [`migrate`][idempotence.contrib.alembic.migrate] owns.

    ```python
    context.configure(connection=connection, target_metadata=Base.metadata,
                      include_name=include_name)
    ```
    """
    if type_ == "table":
        return name not in _ALL_TABLES
    return True


_ALL_TABLES = frozenset(tables("postgres")) | frozenset(tables("sqlite"))


def migrate(op: Any) -> list[str]:
    """Apply the library migrations the database lacks, in the running Alembic
    migration's transaction; return their versions. ``op`` is ``alembic.op``."""
    conn = _connection(op)
    return run(migrate_op(conn._dialect), conn)


def drop(op: Any) -> None:
    """Drop the library's tables (a downgrade): every key, staged job and job is lost."""
    conn = _connection(op)
    for table in reversed(tables(conn._dialect.name)):
        conn.fetch(Query("drop", f"DROP TABLE IF EXISTS {table}", {}))


def _connection(op: Any) -> _SqlConnection:
    from alembic import context

    if context.is_offline_mode():
        raise ConfigurationError(
            "idempotence.contrib.alembic needs an online migration (it reads which of "
            "its migrations the database has): run `alembic upgrade` without --sql, or "
            "emit the schema with `idempotence migrate`"
        )
    bind = op.get_bind()
    return _SqlConnection(bind, dialect_for(bind.engine), _no_sessions)


def _no_sessions(**_: Any) -> Any:
    raise ConfigurationError("no ORM session in an Alembic migration")
