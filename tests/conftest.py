"""Fixtures: real databases for every test, and every store behind one face.

PostgreSQL comes from tests/support/postgres.py (an explicit server, the local one,
or a throwaway cluster); each test run gets its own database, dropped at the end.
Each test works in a scope of its own, so tests never see each other's keys. SQLite
databases are files in the test's temporary directory.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from idempotence import SqliteStore
from idempotence.stores.capabilities import Capability
from idempotence.stores.postgres import PostgresStore
from tests.support.postgres import (
    ProvidedServer,
    create_database,
    drop_database,
    provide_server_info,
)
from tests.support.sources import SOURCES, OnSource, open_on
from tests.support.stores import STORES, Blocking, EventLoopThread, StoreKind, opener

# No per-example deadline: the property tests check behaviour, not speed (benchmarks do
# that), and on two loaded cores an example can take longer than hypothesis's 200 ms.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

#: The stores the suites that need a SQL store run on: those sharing transactions.
STORE_IDS = [
    kind for kind, (cls, _) in STORES.items() if Capability.TRANSACTIONS in cls.capabilities
]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every ``store_kind`` test on each SQL store; a test that parametrizes
    ``store_kind`` itself, or a module that names its own ``STORE_KINDS``, decides
    alone."""
    if "store_kind" not in metafunc.fixturenames:
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        if "store_kind" in str(marker.args[0]).replace(" ", "").split(","):
            return
    ids = getattr(metafunc.module, "STORE_KINDS", STORE_IDS)
    metafunc.parametrize("store_kind", list(ids), indirect=True)


_NOT_STARTED = "not started (no test needed it)"
_server_description = _NOT_STARTED


def pytest_report_header() -> str:
    return "idempotence: PostgreSQL from tests/support/postgres.py (see the summary)"


#: What each of pytest-xdist's workers used (``-n``), as the workers report it.
_worker_descriptions: set[str] = set()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    used = sorted(_worker_descriptions - {_NOT_STARTED}) or [_server_description]
    terminalreporter.write_line(f"PostgreSQL used by the tests: {'; '.join(used)}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    # In a worker: hand the controller what this process used, for the summary.
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["postgres"] = _server_description


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    description = getattr(node, "workeroutput", {}).get("postgres")
    if description:
        _worker_descriptions.add(description)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[ProvidedServer]:
    """A real PostgreSQL server; the run fails (never skips) if none can be had."""
    global _server_description
    with provide_server_info() as server:
        _server_description = server.description
        yield server


@contextlib.contextmanager
def migrated_database(server_url: str, prefix: str = "idempotence") -> Iterator[str]:
    url = create_database(server_url, prefix=prefix)
    try:
        with PostgresStore(url) as store:
            store.migrate()
        yield url
    finally:
        drop_database(server_url, url)


@pytest.fixture(scope="session")
def pg_url(pg_server: ProvidedServer) -> Iterator[str]:
    """A migrated database of this test run's own."""
    with migrated_database(pg_server.url) as url:
        yield url


@pytest.fixture
def fresh_pg_url(pg_server: ProvidedServer) -> Iterator[str]:
    """A migrated database of this test's own, for a test that depends on what the
    key table holds or on its statistics."""
    with migrated_database(pg_server.url, prefix="idempotence_fresh") as url:
        yield url


@pytest.fixture
def empty_pg_url(pg_server: ProvidedServer) -> Iterator[str]:
    """A database with no schema at all."""
    url = create_database(pg_server.url, prefix="idempotence_empty")
    try:
        yield url
    finally:
        drop_database(pg_server.url, url)


@pytest.fixture
def sqlite_path(tmp_path: Path) -> str:
    path = str(tmp_path / "keys.sqlite3")
    with SqliteStore(path) as store:
        store.migrate()
    return path


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[EventLoopThread]:
    loop = EventLoopThread()
    yield loop
    loop.close()


@pytest.fixture
def store_kind(request: pytest.FixtureRequest) -> StoreKind:
    """Each store the library ships, in each flavour (tests/support/stores.py)."""
    backend, flavour = request.param.split("-")
    return StoreKind(backend, flavour, opener(request.param, request))


@pytest.fixture
def store(store_kind: StoreKind, loop_thread: EventLoopThread) -> Iterator[Any]:
    """The store under test, with a sync face whatever its flavour."""
    opened = store_kind.open()
    face: Any = opened if store_kind.flavour == "sync" else Blocking(opened, loop_thread)  # type: ignore[arg-type]
    try:
        yield face
    finally:
        face.close()


@pytest.fixture
def scope() -> str:
    """A scope of this test's own."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=SOURCES)
def on_source(
    request: pytest.FixtureRequest, loop_thread: EventLoopThread, pg_url: str, sqlite_path: str
) -> Iterator[OnSource]:
    """Each store on each kind of source it takes (tests/support/sources.py)."""
    opened = open_on(request.param, loop_thread, pg_url, sqlite_path)
    try:
        yield opened
    finally:
        opened.store.close()
        for close in opened.app_close:
            close()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The shared Redis (the run fails, never skips, without one)."""
    from tests.support.redis import SHARED_URL, require

    return require(SHARED_URL)


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own on the shared Redis, its keys deleted after."""
    import redis

    from tests.support.redis import delete_prefix, unique_prefix

    prefix = unique_prefix()
    yield prefix
    with redis.Redis.from_url(redis_url) as client:
        delete_prefix(client, prefix)
