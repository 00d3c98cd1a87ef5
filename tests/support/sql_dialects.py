"""What the shared test suites write differently on each SQL database: one row per
backend of the library's table (``idempotence._backends``), by its name.

The maintenance suites, the conformance suite's ``age_lock`` and the checkout flow
reach a store's database beside the store (to age a key's times, to count rows, to
keep an application's table); the few things that differ between databases are
here, so a new SQL store adds its row and the suites run on it as they are.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Sql:
    """One database's spelling of what the suites need."""

    aged: str
    """A time column ``{c}`` moved ``:s`` seconds (``:us`` microseconds) back."""
    key: str
    """The key table's ``key`` column as a statement names it."""
    count_again: str
    """What an ``INSERT`` of an existing primary key ``{pk}`` does instead: add 1 to
    ``{table}.{column}``."""
    execute: Callable[[str, str, dict[str, Any] | None], Rows]
    """Run a statement with ``%(name)s`` parameters on a connection of its own to
    the database at the URL (or path), committed; its rows."""


def _postgres(url: str, sql: str, params: dict[str, Any] | None) -> Rows:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as pg:
        cur = pg.execute(sql.encode(), params or {})
        return list(cur.fetchall()) if cur.description else []


def _sqlite(path: str, sql: str, params: dict[str, Any] | None) -> Rows:
    lite = sqlite3.connect(path.removeprefix("sqlite:///"), isolation_level=None)
    try:
        lite.row_factory = sqlite3.Row
        rows = lite.execute(re.sub(r"%\((\w+)\)s", r":\1", sql), params or {}).fetchall()
        return [dict(row) for row in rows]
    finally:
        lite.close()


def mariadb_connection(url: str, *, autocommit: bool = True) -> Any:
    """A PyMySQL connection of the test's own to the database at ``url`` (rows as
    dicts)."""
    import pymysql

    from idempotence.stores.mariadb import Settings

    where = Settings.from_url(url)
    return pymysql.connect(
        host=where.host,
        port=where.port,
        user=where.user,
        password=where.password,
        database=where.database,
        autocommit=autocommit,
        cursorclass=pymysql.cursors.DictCursor,
    )


def _mariadb(url: str, sql: str, params: dict[str, Any] | None) -> Rows:
    conn = mariadb_connection(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params or None)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


SQL = {
    "postgres": Sql(
        aged="{c} - make_interval(secs => :s)",
        key="key",
        count_again="ON CONFLICT ({pk}) DO UPDATE SET {column} = {table}.{column} + 1",
        execute=_postgres,
    ),
    # SQLite keeps its times as seconds since the epoch.
    "sqlite": Sql(
        aged="{c} - :s",
        key="key",
        count_again="ON CONFLICT ({pk}) DO UPDATE SET {column} = {table}.{column} + 1",
        execute=_sqlite,
    ),
    # KEY is a reserved word in MariaDB.
    "mariadb": Sql(
        aged="{c} - INTERVAL :us MICROSECOND",
        key="`key`",
        count_again="ON DUPLICATE KEY UPDATE {column} = {column} + 1",
        execute=_mariadb,
    ),
}
"""Each SQL backend's row, by the backend's name."""
