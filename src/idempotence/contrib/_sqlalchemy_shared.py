"""What the SQLAlchemy stores share, sync or async: SQLAlchemy's names in both
spellings (so that `_sqlalchemy` can be generated from `_sqlalchemy_async`),
the dialect of an engine, and the translation of SQLAlchemy's errors.

The stores are in `_sqlalchemy_async` (the source) and `_sqlalchemy`
(generated from it); [`sqlalchemy`][idempotence.contrib.sqlalchemy] is their public face.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    import sqlalchemy
    from sqlalchemy import Connection, Engine
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
    from sqlalchemy.ext.asyncio import async_sessionmaker as AsyncSessionMaker
    from sqlalchemy.orm import Session
    from sqlalchemy.orm import sessionmaker as SessionMaker
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the SQLAlchemy stores need SQLAlchemy 2: pip install 'idempotence[sqlalchemy]'"
    ) from exc

from ..errors import ConfigurationError, StoreError, StoreUnavailable
from ..stores.sql import Dialect, KeyHeld

__all__ = [
    "AsyncConnection",
    "AsyncEngine",
    "AsyncSession",
    "AsyncSessionMaker",
    "Connection",
    "Engine",
    "Session",
    "SessionMaker",
    "dialect_for",
    "driver_of",
    "translated",
]

DRIVERS = {("postgresql", "psycopg"), ("sqlite", "pysqlite"), ("sqlite", "aiosqlite")}
"""The drivers whose placeholders and errors the stores know: psycopg 3 on PostgreSQL
(``postgresql+psycopg://``), the standard sqlite3 module or aiosqlite on SQLite."""

JOIN_MODE = "rollback_only"
"""How the ORM session of a store's transaction joins it. ``rollback_only``: the
session's ``commit()`` only flushes (the transaction commits when the store's
block does, with the claim and the stored response); its ``rollback()`` rolls the
whole transaction back, the claim included, and the store's next statement then
refuses to run in it (see `require_active`)."""


def dialect_for(engine: Engine) -> Dialect:
    """The store dialect for a (sync) engine, or ConfigurationError."""
    name, driver = engine.dialect.name, engine.dialect.driver
    if (name, driver) not in DRIVERS:
        raise ConfigurationError(
            f"the SQLAlchemy store runs on PostgreSQL with psycopg 3 (postgresql+psycopg://) "
            f"or on SQLite (sqlite://, sqlite+aiosqlite://), not on {name}+{driver}"
        )
    if name == "postgresql":
        from ..stores.postgres import PostgresDialect

        return PostgresDialect()
    from ..stores.sqlite import SqliteDialect

    return SqliteDialect()


def driver_of(conn: Connection | AsyncConnection) -> Any:
    """The driver's own connection under a SQLAlchemy connection (aiosqlite's, async)."""
    sync = conn.sync_connection if isinstance(conn, AsyncConnection) else conn
    assert sync is not None
    return sync.connection.driver_connection


def translate(dialect: Dialect, exc: sqlalchemy.exc.SQLAlchemyError) -> StoreError:
    """The library's error for a SQLAlchemy error (the caller raises it ``from``): the
    driver's error under it is translated as its own store does."""
    if isinstance(exc, sqlalchemy.exc.TimeoutError):
        return StoreUnavailable(f"no connection from the SQLAlchemy pool: {exc}")
    orig = getattr(exc, "orig", None)
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
        return StoreUnavailable(f"the database connection was lost: {orig or exc}")
    if isinstance(orig, Exception):
        if dialect.name == "postgres":
            from ..stores.postgres import translate as postgres

            return postgres(orig)
        from ..stores.sqlite import translate as sqlite

        if isinstance(orig, sqlite3.Error):
            return sqlite(orig)
    return StoreError(f"SQLAlchemy error: {exc}")


@contextmanager
def translated(dialect: Dialect, *, claim: bool = False) -> Iterator[None]:
    """Translate SQLAlchemy's errors; with ``claim``, a claim's lock wait that ran
    out (F8, PostgreSQL) is [`KeyHeld`][idempotence.stores.sql.KeyHeld]."""
    try:
        yield
    except sqlalchemy.exc.SQLAlchemyError as exc:
        if claim and type(getattr(exc, "orig", None)).__name__ == "LockNotAvailable":
            raise KeyHeld(str(exc)) from exc
        raise translate(dialect, exc) from exc


def require_active(transaction: Any) -> None:
    """Refuse to run the store's statements in a transaction the application ended."""
    if not transaction.is_active:
        raise ConfigurationError(
            "the store's transaction was ended by the application (a session.rollback() "
            "or a commit on its connection): the claim and the writes in it are rolled "
            "back, and nothing more can be stored in it. Leave the transaction to the "
            "store: raise to roll it back"
        )
