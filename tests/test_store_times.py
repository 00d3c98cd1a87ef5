"""Times are the database's clock (DESIGN 3) on the SQL stores, sync and async: read
with each database's own SQL, which the exported conformance suite cannot write for
every store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from idempotence import ClaimRequest
from tests.support.stores import StoreKind


def test_times_are_the_database_clock(store: Any, store_kind: StoreKind, scope: str) -> None:
    def db_now() -> Any:
        with store.transaction() as tx:
            sql = (
                "SELECT statement_timestamp() AS now"
                if store_kind.backend == "postgres"
                else "SELECT (julianday('now') - 2440587.5) * 86400.0 AS now"
            )
            return tx.execute(sql)[0]["now"]

    before = db_now()
    record = store.claim(ClaimRequest(scope=scope, key="key-1", fingerprint="a" * 64)).record
    after = db_now()
    if store_kind.backend == "sqlite":
        before = datetime.fromtimestamp(before, UTC)
        after = datetime.fromtimestamp(after, UTC)
    # julianday keeps milliseconds
    slack = timedelta(milliseconds=2)
    assert before - slack <= record.created_at <= after + slack
    assert before - slack <= record.locked_at <= after + slack
    assert record.expires_at - record.created_at == timedelta(hours=24)
