"""Fixtures for the maintenance suites: a fresh migrated database per test, on
PostgreSQL (a copy of a migrated template, so it is quick) and on SQLite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from psycopg.conninfo import conninfo_to_dict

from idempotence import AsyncSqliteStore, SqliteStore
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from tests.consumers.broker import broker_url
from tests.maintenance.support import Backend, Flavour
from tests.support.postgres import ProvidedServer, create_database, drop_database


@pytest.fixture(scope="session")
def maintenance_template(pg_server: ProvidedServer) -> Iterator[str]:
    """The name of a migrated database to copy; nobody connects to it afterwards."""
    url = create_database(pg_server.url, prefix="idempotence_mtpl")
    try:
        with PostgresStore(url) as store:
            store.migrate()
        yield str(conninfo_to_dict(url)["dbname"])
    finally:
        drop_database(pg_server.url, url)


@pytest.fixture
def own_pg_url(pg_server: ProvidedServer, maintenance_template: str) -> Iterator[str]:
    url = create_database(pg_server.url, prefix="idempotence_m", template=maintenance_template)
    try:
        yield url
    finally:
        drop_database(pg_server.url, url)


@pytest.fixture
def own_sqlite_url(tmp_path: Path) -> str:
    path = tmp_path / "maintenance.sqlite3"
    with SqliteStore(str(path)) as store:
        store.migrate()
    return f"sqlite:///{path}"


# On PostgreSQL every test gets a database of its own (the services scan every scope),
# which costs a second or two each: the fast tier runs them on SQLite, the slow tier
# on both.
@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.slow), "sqlite"])
def db(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """A database of the test's own, on each backend."""
    if request.param == "postgres":
        url = request.getfixturevalue("own_pg_url")
        backend = Backend(
            "postgres", url, lambda: PostgresStore(url), lambda: AsyncPostgresStore(url)
        )
    else:
        url = request.getfixturevalue("own_sqlite_url")
        path = url.removeprefix("sqlite:///")
        backend = Backend("sqlite", url, lambda: SqliteStore(path), lambda: AsyncSqliteStore(path))
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
def pg_db(own_pg_url: str) -> Iterator[Backend]:
    """PostgreSQL only: for what SQLite cannot do (two writers at once)."""
    backend = Backend(
        "postgres",
        own_pg_url,
        lambda: PostgresStore(own_pg_url),
        lambda: AsyncPostgresStore(own_pg_url),
    )
    try:
        yield backend
    finally:
        backend.close()


# The async services are generated from the same source as the sync ones (F7): the
# fast tier runs the sync flavour, the slow tier both.
@pytest.fixture(params=["sync", pytest.param("async", marks=pytest.mark.slow)])
def flavour(request: pytest.FixtureRequest, db: Backend) -> Flavour:
    """Makes the service under test sync, or async on an async store (F7): each async
    service must do what its generated sync twin does."""
    return Flavour(request.param, db)


@pytest.fixture
def queue() -> Iterator[str]:
    """A queue name of the test's own, deleted after."""
    name = f"idem-sink-{uuid.uuid4().hex[:10]}"
    yield name
    connection = pika.BlockingConnection(pika.URLParameters(broker_url()))
    try:
        connection.channel().queue_delete(name)
    finally:
        connection.close()
