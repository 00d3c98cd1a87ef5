"""The HTTP contract (P1-P11) on the MariaDB store, through Starlette (async store)
and Flask (sync store): the tests of tests/http/test_http_contract.py, collected here
again with ``backend`` set to MariaDB (issue 31 item 6). MariaDB has no LISTEN, so
the waiting twin of P10 polls."""

from __future__ import annotations

import pytest

from tests.http.test_http_contract import *  # noqa: F403 - the same tests, collected here

#: The slow tier: the HTTP contract on MariaDB (the fast tier runs it on SQLite).
pytestmark = pytest.mark.slow

# PostgreSQL's NOTIFY wake-up: MariaDB has none (its twins poll, as the P10 tests show).
del test_p10_postgres_wakes_the_twin_by_notify_not_by_its_next_poll  # noqa: F821


@pytest.fixture(params=["starlette", "flask"])
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["mariadb"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
