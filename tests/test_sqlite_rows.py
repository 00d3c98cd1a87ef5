"""The rows of the SQLite store's statements: the column names of every statement, the store's
own too, are read at every statement; lock timeouts come back as the durations they were."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest

from idempotence.errors import SchemaMissing, StoreError
from idempotence.stores._sql.ops import APPLICATION, Query
from idempotence.stores.sqlite._store_shared import SqliteConnection, SqliteDialect


def test_a_store_statement_whose_columns_change_is_read_again() -> None:
    conn = SqliteConnection(sqlite3.connect(":memory:", isolation_level=None))
    conn.raw.execute("CREATE TABLE t (a INTEGER)")
    conn.raw.execute("INSERT INTO t VALUES (1)")
    select = Query("store statement", "SELECT * FROM t", {})
    assert conn.fetch(select) == [{"a": 1}]
    conn.raw.execute("ALTER TABLE t ADD COLUMN b INTEGER DEFAULT 2")  # a migration
    assert conn.fetch(select) == [{"a": 1, "b": 2}]
    conn.raw.execute("INSERT INTO t VALUES (3, 4)")
    assert conn.fetch(select) == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    # One that renames a column: as many columns, another name.
    conn.raw.execute("ALTER TABLE t RENAME COLUMN a TO renamed")
    assert conn.fetch(select) == [{"renamed": 1, "b": 2}, {"renamed": 3, "b": 4}]


def test_the_applications_column_names_are_read_at_every_statement() -> None:
    conn = SqliteConnection(sqlite3.connect(":memory:", isolation_level=None))
    conn.raw.execute("CREATE TABLE t (a INTEGER)")
    conn.raw.execute("INSERT INTO t VALUES (1)")
    select = Query(APPLICATION, "SELECT * FROM t", {})
    assert conn.fetch(select) == [{"a": 1}]
    conn.raw.execute("ALTER TABLE t RENAME COLUMN a TO renamed")  # as many columns
    assert conn.fetch(select) == [{"renamed": 1}]


def test_durations_come_back_as_stored() -> None:
    dialect = SqliteDialect()
    for seconds in [30.0, 1.5, 30.0, 0.25, *range(100), 1.5]:
        assert dialect.duration_out(seconds) == timedelta(seconds=seconds)
    assert dialect.duration_out(dialect.duration_in(timedelta(minutes=5))) == timedelta(minutes=5)


def test_a_failed_statement_translates_and_the_next_runs() -> None:
    conn = SqliteConnection(sqlite3.connect(":memory:", isolation_level=None))
    with pytest.raises(SchemaMissing):
        conn.fetch(Query("get", "SELECT * FROM missing", {}))
    with pytest.raises(StoreError) as raised:  # the application's: not the key store's
        conn.fetch(Query(APPLICATION, "SELECT * FROM missing", {}))
    assert not isinstance(raised.value, SchemaMissing)
    assert conn.fetch(Query("store statement", "SELECT 1 AS one", {})) == [{"one": 1}]
