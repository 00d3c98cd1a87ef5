"""Fixtures for the flow suites: databases with the example's tables, a provider, and a
runner that drives a flow on each of the four stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotence import SqliteStore
from idempotence.stores.postgres import PostgresStore
from idempotence.testing import FakeProvider
from idempotence.testing.example import create_tables
from tests.flows.support import NOTES_TABLE, FlowRunner
from tests.support.postgres import ProvidedServer, create_database, drop_database
from tests.support.stores import EventLoopThread, StoreKind


@pytest.fixture(scope="session")
def pg_flows_url(pg_url: str) -> str:
    """The run's PostgreSQL database, with the example's and the tests' tables."""
    with PostgresStore(pg_url) as store:
        create_tables(store)
        with store.transaction() as tx:
            tx.execute(NOTES_TABLE)
    return pg_url


@pytest.fixture
def sqlite_flows_path(sqlite_path: str) -> str:
    with SqliteStore(sqlite_path) as store:
        create_tables(store)
        with store.transaction() as tx:
            tx.execute(NOTES_TABLE)
    return sqlite_path


@pytest.fixture
def fresh_pg_url(pg_server: ProvidedServer) -> Iterator[str]:
    """A migrated PostgreSQL database of this test's own: for tests of tables that
    are not split by scope (the staged jobs)."""
    url = create_database(pg_server.url, prefix="idempotence_flows")
    try:
        with PostgresStore(url) as store:
            store.migrate()
            with store.transaction() as tx:
                tx.execute(NOTES_TABLE)
        yield url
    finally:
        drop_database(pg_server.url, url)


@pytest.fixture(params=["postgres", "sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest) -> str:
    """A database URL of ``backend`` with the example's tables, for child processes."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_flows_url"))
    return "sqlite:///" + request.getfixturevalue("sqlite_flows_path")


@pytest.fixture
def provider(tmp_path: Path) -> FakeProvider:
    return FakeProvider(tmp_path / "provider.sqlite3")


@pytest.fixture
def runner(
    store_kind: StoreKind, store: Any, loop_thread: EventLoopThread, request: pytest.FixtureRequest
) -> FlowRunner:
    """Runs flows on each store, sync and async (``run`` or ``run_async``)."""
    if store_kind.backend == "postgres":
        url = request.getfixturevalue("pg_flows_url")
        other: Any = lambda: PostgresStore(url)  # noqa: E731
    else:
        path = request.getfixturevalue("sqlite_flows_path")
        other = lambda: SqliteStore(path)  # noqa: E731
    return FlowRunner(store_kind, store, loop_thread, other)
