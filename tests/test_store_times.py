"""Times are the database's clock (DESIGN 3) on the SQL stores, sync and async: read
with each database's own SQL, which the exported conformance suite cannot write for
every store; a key's status is named on that clock too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from idempotence import ClaimRequest, KeyState, StoredResponse, states
from idempotence.stores._sql import ops as _ops
from tests.support.clock import app_clock_ahead
from tests.support.stores import StoreKind

HOUR = timedelta(hours=1)


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


def test_a_key_status_is_named_on_the_database_clock(
    store: Any, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The application's clock two hours ahead where a status could read it: a key
    # with an hour of retention is still complete by the database's clock.
    app_clock_ahead(monkeypatch, 2 * HOUR, _ops, states)
    request = ClaimRequest(scope=scope, key="key-1", fingerprint="a" * 64, retention=HOUR)
    store.finish(store.claim(request).lease, StoredResponse.of(201))
    status = store.key_status(scope, "key-1")
    assert status.state is KeyState.COMPLETE
    assert status.finished_at <= status.now < status.finished_at + timedelta(minutes=1)
