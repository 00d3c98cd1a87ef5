"""The HTTP contract (P1-P11) on the MariaDB store, through Starlette (async store)
and Flask (sync store): the tests of tests/http/test_http_contract.py, collected here
again with ``backend`` set to MariaDB (issue 31 item 6). MariaDB has no LISTEN, so
the waiting twin of P10 polls."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.http import apps
from tests.http.clients import sync_store
from tests.http.test_http_contract import *  # noqa: F403 - the same tests, collected here
from tests.support.mariadb import database

# PostgreSQL's NOTIFY wake-up: MariaDB has none (its twins poll, as the P10 tests show).
del test_p10_postgres_wakes_the_twin_by_notify_not_by_its_next_poll  # noqa: F821


@pytest.fixture(scope="module")
def mariadb_http_url() -> Iterator[str]:
    """A migrated database of this module's own, with the request-as-transaction table."""
    with database(prefix="idempotence_http") as url:
        with sync_store("mariadb", url) as store, store.transaction() as tx:
            tx.execute(apps.TABLE)
        yield url


@pytest.fixture(params=["starlette", "flask"])
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["mariadb"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(mariadb_http_url: str) -> str:
    return mariadb_http_url
