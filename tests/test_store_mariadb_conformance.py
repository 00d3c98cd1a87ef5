"""The store conformance suite (DESIGN 4, F1, F2, R2, F3) on the MariaDB store, sync
and async (DESIGN 8, issue 31 item 6).

The tests are those of tests/test_store_conformance.py, collected here again with the
``store`` fixture opening a MariaDB store on a database of this module's own (the
machine's MariaDB, or a throwaway server: tests/support/mariadb.py). The one test of
that suite that reads the database clock in each dialect's own SQL is restated here
in MariaDB's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from idempotence.stores.mariadb import AsyncMariaDBStore, MariaDBStore
from tests.support.mariadb import mariadb_url  # noqa: F401 - the fixture
from tests.support.stores import StoreKind
from tests.test_store_conformance import *  # noqa: F403 - the same tests, collected here
from tests.test_store_conformance import request

#: The conftest's hook parametrizes ``store_kind`` with these.
STORE_KINDS = ["mariadb-sync", "mariadb-async"]


@pytest.fixture
def store_kind(request: pytest.FixtureRequest, mariadb_url: str) -> StoreKind:  # noqa: F811
    """The MariaDB store, in each flavour."""
    _, flavour = request.param.split("-")
    opener: Any = MariaDBStore if flavour == "sync" else AsyncMariaDBStore
    return StoreKind("mariadb", flavour, lambda: opener(mariadb_url))


def test_times_are_the_database_clock(store: Any, scope: str) -> None:
    def db_now() -> Any:
        with store.transaction() as tx:
            return tx.execute("SELECT UTC_TIMESTAMP(6) AS now")[0]["now"]

    from datetime import UTC

    before = db_now().replace(tzinfo=UTC)
    record = store.claim(request(scope)).record
    after = db_now().replace(tzinfo=UTC)
    # Microseconds, in UTC: no slack needed.
    assert before <= record.created_at <= after
    assert before <= record.locked_at <= after
    assert record.created_at.tzinfo is UTC
    assert record.expires_at - record.created_at == timedelta(hours=24)
