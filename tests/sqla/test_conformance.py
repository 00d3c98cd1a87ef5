"""The store conformance suite (idempotence.testing.conformance) on the SQLAlchemy
stores, sync and async, each on PostgreSQL (psycopg 3) and on SQLite (the standard
module, and aiosqlite). Each test works in a scope of its own, so the tests of this
module share one migrated database on each (creating one per test would cost more
than the tests)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from idempotence.contrib.sqlalchemy import AsyncSQLAlchemyStore, SQLAlchemyStore
from idempotence.testing.conformance import suite
from tests.sqla.conftest import Database
from tests.support.clock import age_key, age_lock
from tests.support.postgres import ProvidedServer, create_database, drop_database


# The fast tier runs the sync store on SQLite; PostgreSQL, and the async store, are slow.
@pytest.fixture(scope="module", params=[pytest.param("postgres", marks=pytest.mark.slow), "sqlite"])
def migrated(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Database]:
    """One migrated database of the module's own, on each backend."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("sqla") / "app.sqlite3"
        database = Database("sqlite", f"sqlite:///{path}", f"sqlite+aiosqlite:///{path}")
        url = None
    else:
        server: ProvidedServer = request.getfixturevalue("pg_server")
        url = create_database(server.url, prefix="idempotence_sqla")
        psycopg_url = url.replace("postgresql://", "postgresql+psycopg://", 1)
        database = Database("postgres", psycopg_url, psycopg_url)
    engine = sa.create_engine(database.sync_url)
    try:
        SQLAlchemyStore(engine).migrate()
    finally:
        engine.dispose()
    try:
        yield database
    finally:
        if url is not None:
            drop_database(server.url, url)


def open_sync(migrated: Database, request: pytest.FixtureRequest) -> SQLAlchemyStore:
    engine = sa.create_engine(migrated.sync_url)
    request.addfinalizer(engine.dispose)
    return SQLAlchemyStore(sessionmaker(engine))


def open_async(migrated: Database) -> AsyncSQLAlchemyStore:
    # No pool: the suite runs the store on an event loop of its own, closed after the
    # test, and no connection may outlive it.
    engine: Any = create_async_engine(migrated.async_url, poolclass=NullPool)
    return AsyncSQLAlchemyStore(async_sessionmaker(engine))


TestSQLAlchemy = suite(SQLAlchemyStore, open_sync, age_lock=age_lock, age_key=age_key)
TestAsyncSQLAlchemy = pytest.mark.slow(
    suite(AsyncSQLAlchemyStore, open_async, age_lock=age_lock, age_key=age_key)
)
