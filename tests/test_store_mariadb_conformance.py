"""The store conformance suite (idempotence.testing.conformance: DESIGN 4, F1, F2, R2,
F3) on the MariaDB store, sync and async (DESIGN 8, issue 31 item 6), on a database of
this run's own (the machine's MariaDB, or a throwaway server: tests/support/mariadb.py).
Locks are aged by moving their time back (tests/support/clock.py). The database clock
test, which each dialect writes in its own SQL, is restated here in MariaDB's.
"""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest

from idempotence import ClaimRequest
from idempotence.stores.mariadb import AsyncMariaDBStore, MariaDBStore
from idempotence.testing.conformance import suite
from tests.support.clock import age_key, age_lock
from tests.support.mariadb import mariadb_url  # noqa: F401 - the fixture


def open_sync(mariadb_url: str) -> MariaDBStore:  # noqa: F811 - the fixture, by name
    return MariaDBStore(mariadb_url)


def open_async(mariadb_url: str) -> AsyncMariaDBStore:  # noqa: F811 - the fixture, by name
    return AsyncMariaDBStore(mariadb_url)


TestMariaDB = suite(MariaDBStore, open_sync, age_lock=age_lock, age_key=age_key)
TestAsyncMariaDB = pytest.mark.slow(
    suite(AsyncMariaDBStore, open_async, age_lock=age_lock, age_key=age_key)
)


def test_times_are_the_database_clock(mariadb_url: str, scope: str) -> None:  # noqa: F811
    with MariaDBStore(mariadb_url) as store:

        def db_now():
            with store.transaction() as tx:
                return tx.execute("SELECT UTC_TIMESTAMP(6) AS now")[0]["now"].replace(tzinfo=UTC)

        before = db_now()
        record = store.claim(ClaimRequest(scope=scope, key="key-1", fingerprint="a" * 64)).record
        after = db_now()
    # Microseconds, in UTC: no slack needed.
    assert before <= record.created_at <= after
    assert before <= record.locked_at <= after
    assert record.created_at.tzinfo is UTC
    assert record.expires_at - record.created_at == timedelta(hours=24)
