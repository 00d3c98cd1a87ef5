"""The HTTP crash tests on the MariaDB store: a server SIGKILLed mid-request (a flow
between phases, a request-as-transaction handler before its commit, a plain handler),
restarted, and the request retried on the same key resumes without a duplicate (F3,
R1, P5); a live handler slower than its lock timeout is never taken over, a killed
one's key is (F2). Through uvicorn (async store) and waitress (sync store): the tests
of tests/http/test_http_crash.py, collected here again with ``backend`` set to MariaDB.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.http import crash_server
from tests.http.clients import sync_store
from tests.http.test_http_crash import *  # noqa: F403 - the same tests, collected here
from tests.support.mariadb import database


@pytest.fixture(scope="module")
def mariadb_crash_url() -> Iterator[str]:
    """A migrated database of this module's own, with the crash server's table."""
    with database(prefix="idempotence_crash") as url:
        with sync_store("mariadb", url) as store, store.transaction() as tx:
            tx.execute(crash_server.TABLE)
        yield url


@pytest.fixture(params=["mariadb"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(mariadb_crash_url: str) -> str:
    return mariadb_crash_url
