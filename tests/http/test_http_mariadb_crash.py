"""The HTTP crash tests on the MariaDB store: a server SIGKILLed mid-request (a flow
between phases, a request-as-transaction handler before its commit, a plain handler),
restarted, and the request retried on the same key resumes without a duplicate (F3,
R1, P5); a live handler slower than its lock timeout is never taken over, a killed
one's key is (F2). Through uvicorn (async store) and waitress (sync store): the tests
of tests/http/test_http_crash.py, collected here again with ``backend`` set to MariaDB.
"""

from __future__ import annotations

import pytest

from tests.http.test_http_crash import *  # noqa: F403 - the same tests, collected here


@pytest.fixture(params=["mariadb"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
