"""The statements of a transaction, from the dialect (``Dialect.transaction_statements``),
as the connections that send their own BEGIN and COMMIT run them: SQLite's takes the
write lock at BEGIN and releases a savepoint it rolled back to; MariaDB's savepoint
inside the application's transaction rolls back the store's writes alone, or keeps
them, on a real database each."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from idempotence.stores.mariadb import MariaDBStore
from idempotence.stores.sqlite import SqliteConnection, connect
from tests.support.mariadb import connect as mariadb_connect
from tests.support.mariadb import mariadb_url  # noqa: F401 - the fixture


class Boom(Exception):
    pass


def test_sqlite_a_store_transaction_takes_the_write_lock_at_its_begin(tmp_path: Path) -> None:
    path = str(tmp_path / "keys.db")
    conn = SqliteConnection(connect(path))
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        # Nothing written yet, and no other writer may begin: the claim's read and
        # write are one unit.
        with conn.atomic(), pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")  # free again after the commit
        other.execute("ROLLBACK")
    finally:
        other.close()
        conn.raw.close()


def test_sqlite_a_savepoint_rolled_back_to_is_released_too() -> None:
    raw = sqlite3.connect(":memory:", isolation_level=None)
    raw.execute("CREATE TABLE effects (what TEXT)")
    sent: list[str] = []
    raw.set_trace_callback(sent.append)
    conn = SqliteConnection(raw)
    raw.execute("BEGIN")
    raw.execute("INSERT INTO effects VALUES ('outer')")
    with pytest.raises(Boom), conn.atomic():
        raw.execute("INSERT INTO effects VALUES ('inner')")
        raise Boom
    savepoint = next(s for s in sent if s.startswith("SAVEPOINT ")).removeprefix("SAVEPOINT ")
    assert raw.in_transaction  # the application's transaction goes on
    with pytest.raises(sqlite3.OperationalError, match="no such savepoint"):
        raw.execute(f"RELEASE SAVEPOINT {savepoint}")
    raw.execute("COMMIT")
    assert raw.execute("SELECT what FROM effects").fetchall() == [("outer",)]
    raw.close()


@pytest.mark.parametrize("fails", [True, False])
def test_mariadb_a_store_transaction_in_the_applications_is_a_savepoint(
    mariadb_url: str,  # noqa: F811
    fails: bool,
) -> None:
    table = f"savepoint_effects_{'fails' if fails else 'commits'}"
    raw = mariadb_connect(mariadb_url)
    try:
        with raw.cursor() as cur:
            cur.execute(f"CREATE TABLE IF NOT EXISTS {table} (what TEXT)")
            cur.execute(f"DELETE FROM {table}")
        store = MariaDBStore(raw)
        raw.begin()
        with raw.cursor() as cur:
            cur.execute(f"INSERT INTO {table} VALUES ('outer')")
        try:
            with store.transaction() as tx:
                tx.execute(f"INSERT INTO {table} VALUES ('inner')")
                if fails:
                    raise Boom
        except Boom:
            pass
        with raw.cursor() as cur:
            cur.execute("SELECT @@in_transaction AS open")
            assert cur.fetchone()["open"] == 1  # the application's goes on
        raw.commit()
        with raw.cursor() as cur:
            cur.execute(f"SELECT what FROM {table} ORDER BY what")
            found = [row["what"] for row in cur.fetchall()]
        assert found == (["outer"] if fails else ["inner", "outer"])
    finally:
        raw.close()
