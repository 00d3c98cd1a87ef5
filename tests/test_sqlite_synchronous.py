"""``synchronous=``: the SQLite stores set ``PRAGMA synchronous`` on their own connections.

The benchmark compares SQLite's default durability with ``NORMAL`` (WAL mode, no fsync
per commit); a user chooses it with this option, so it must reach every connection the
store opens, and a value it cannot apply must fail when the store is built.
"""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from idempotence import AsyncSqliteStore, SqliteStore
from idempotence.errors import ConfigurationError

FULL, NORMAL = 2, 1


def _levels(store: SqliteStore, connections: int) -> set[int]:
    """``PRAGMA synchronous`` of ``connections`` connections the store holds at once."""
    levels: set[int] = set()
    with store._source.connection() as first:  # type: ignore[attr-defined]
        levels.add(first.raw.execute("PRAGMA synchronous").fetchone()[0])
        if connections > 1:
            with store._source.connection() as second:  # type: ignore[attr-defined]
                assert second.raw is not first.raw
                levels.add(second.raw.execute("PRAGMA synchronous").fetchone()[0])
    return levels


def test_the_default_is_sqlites_full(sqlite_path: str):
    with SqliteStore(sqlite_path) as store:
        assert _levels(store, 2) == {FULL}


@pytest.mark.parametrize("value", ["NORMAL", "normal"])
def test_normal_reaches_every_connection(sqlite_path: str, value: str):
    with SqliteStore(sqlite_path, synchronous=value) as store:
        store.migrate()
        assert _levels(store, 2) == {NORMAL}
        with store.transaction() as tx:
            assert tx.execute("PRAGMA synchronous") == [{"synchronous": NORMAL}]


def test_the_async_store_takes_it_too(sqlite_path: str):
    async def main() -> list[object]:
        store = AsyncSqliteStore(sqlite_path, synchronous="NORMAL")
        try:
            async with store.transaction() as tx:
                return list(await tx.execute("PRAGMA synchronous"))
        finally:
            await store.close()

    assert asyncio.run(main()) == [{"synchronous": NORMAL}]


@pytest.mark.parametrize("store_class", [SqliteStore, AsyncSqliteStore])
def test_a_bad_value_fails_when_the_store_is_built(sqlite_path: str, store_class: type):
    with pytest.raises(ConfigurationError, match=r"synchronous='fast'.*NORMAL"):
        store_class(sqlite_path, synchronous="fast")
    with pytest.raises(ConfigurationError, match="synchronous="):
        store_class(sqlite_path, synchronous="NORMAL; DROP TABLE idempotency_keys")


@pytest.mark.parametrize("store_class", [SqliteStore, AsyncSqliteStore])
def test_an_applications_connection_is_not_changed_behind_its_back(
    sqlite_path: str, store_class: type
):
    raw = sqlite3.connect(sqlite_path, isolation_level=None, check_same_thread=False)
    try:
        with pytest.raises(ConfigurationError, match="application's connection"):
            store_class(raw, synchronous="NORMAL")
        assert raw.execute("PRAGMA synchronous").fetchone()[0] == FULL
    finally:
        raw.close()
