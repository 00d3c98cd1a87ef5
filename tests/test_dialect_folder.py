"""A dialect outside the package names the folder of its SQL files (``sql_folder``),
and a store built on the public interface (:mod:`idempotence.stores.sql`) runs its
queries and its migrations from there (issue 31: the store interface, public)."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from idempotence import ClaimRequest, Outcome, StoredResponse
from idempotence.stores.sql import Connection, Store
from idempotence.stores.sqlite import SqliteConnection, SqliteDialect, connect


class OneConnection:
    def __init__(self, raw: sqlite3.Connection) -> None:
        self._conn = SqliteConnection(raw)

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        yield self._conn

    def close(self) -> None:
        self._conn.raw.close()


def test_a_dialect_runs_its_own_folder_of_sql_files(tmp_path: Path) -> None:
    folder = tmp_path / "outside_sql"
    shutil.copytree(Path(str(resources.files("idempotence").joinpath("sql", "sqlite"))), folder)
    # A migration only this folder has: proof that its migrations are the ones applied.
    (folder / "migrations" / "9999_outside.sql").write_text("CREATE TABLE outside_marker (x);\n")

    class OutsideDialect(SqliteDialect):
        sql_folder = folder

    dialect = OutsideDialect()
    assert dialect.folder() == folder
    assert SqliteDialect().folder() != folder

    raw = connect(str(tmp_path / "keys.sqlite3"))
    store = Store(OneConnection(raw), dialect)
    try:
        applied = store.migrate()
        assert "9999_outside" in applied
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
        assert "outside_marker" in tables
        request = ClaimRequest(scope="outside", key="k1", fingerprint="f" * 64)
        first = store.claim(request)
        assert first.outcome is Outcome.EXECUTE and first.lease is not None
        store.finish(first.lease, StoredResponse.of(201, body="{}"))
        assert store.claim(request).outcome is Outcome.REPLAY
    finally:
        store.close()
