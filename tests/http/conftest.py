"""Fixtures for the HTTP suites: every framework on both stores, through its own test
client, against real databases (``pg_url``, ``sqlite_path`` from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest

from tests.http import apps
from tests.http.clients import Harness, open_harness, sync_store


@pytest.fixture(scope="session")
def pg_http_url(pg_url: str) -> str:
    """The run's PostgreSQL database, with the request-as-transaction test table."""
    with sync_store("postgres", pg_url) as store, store.transaction() as tx:
        tx.execute(apps.TABLE)
    return pg_url


@pytest.fixture(scope="session")
def mariadb_http_url() -> Iterator[str]:
    """A MariaDB database of the run's own, with the request-as-transaction test table
    (for the modules that collect the HTTP suites again on MariaDB)."""
    from tests.support.mariadb import database

    with database(prefix="idempotence_http") as url:
        with sync_store("mariadb", url) as store, store.transaction() as tx:
            tx.execute(apps.TABLE)
        yield url


@pytest.fixture
def sqlite_http_path(sqlite_path: str) -> str:
    with sync_store("sqlite", sqlite_path) as store, store.transaction() as tx:
        tx.execute(apps.TABLE)
    return sqlite_path


@pytest.fixture(params=apps.FRAMEWORKS)
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# The fast tier runs the HTTP contract on SQLite, the slow tier on PostgreSQL too.
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(backend: str, request: pytest.FixtureRequest) -> str:
    """The database of ``backend``: a SQLite path, a PostgreSQL or MariaDB URL, or (for
    a module whose ``backend`` names it) the shared Redis's URL."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_http_url"))
    if backend == "mariadb":
        return str(request.getfixturevalue("mariadb_http_url"))
    if backend == "redis":
        return str(request.getfixturevalue("redis_url"))
    return str(request.getfixturevalue("sqlite_http_path"))


HarnessFactory = Callable[..., AbstractContextManager[Harness]]


@pytest.fixture
def make_harness(framework: str, backend: str, target: str, scope: str) -> HarnessFactory:
    """Opens the app with configuration overrides (see ``apps.make_config``)."""

    def make(**overrides: Any) -> AbstractContextManager[Harness]:
        return open_harness(framework, backend, target, scope, **overrides)

    return make


@pytest.fixture
def harness(make_harness: HarnessFactory) -> Iterator[Harness]:
    with make_harness() as opened:
        yield opened
