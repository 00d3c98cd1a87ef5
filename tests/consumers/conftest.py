"""Fixtures for the consumer suites: the real broker (fails loudly without one) and
stores with an effects table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from idempotence import SqliteStore
from idempotence.stores.postgres import PostgresStore
from tests.consumers.broker import broker_url
from tests.support.postgres import ProvidedServer, create_database, drop_database

#: The effects the consumers make: no unique constraint, so a second effect shows.
EFFECTS = "CREATE TABLE effects (message_id TEXT NOT NULL, pid INTEGER)"
#: What a downstream system keeps: one row per derived key (R4).
DERIVED = "CREATE TABLE derived (derived_key TEXT PRIMARY KEY)"


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The shared RabbitMQ; the run fails (never skips) when it does not answer."""
    return broker_url()


def _tables(store: SqliteStore | PostgresStore) -> None:
    store.migrate()
    with store.transaction() as tx:
        tx.execute(EFFECTS)
        tx.execute(DERIVED)


@pytest.fixture
def consumer_pg_url(pg_server: ProvidedServer) -> Iterator[str]:
    url = create_database(pg_server.url, prefix="idempotence_consumers")
    try:
        with PostgresStore(url) as store:
            _tables(store)
        yield url
    finally:
        drop_database(pg_server.url, url)


@pytest.fixture
def consumer_sqlite_path(tmp_path: Path) -> str:
    path = str(tmp_path / "consumer.sqlite3")
    with SqliteStore(path) as store:
        _tables(store)
    return path


@pytest.fixture(params=["postgres", "sqlite"])
def consumer_store_url(request: pytest.FixtureRequest) -> str:
    name = "consumer_pg_url" if request.param == "postgres" else "consumer_sqlite_path"
    return str(request.getfixturevalue(name))
