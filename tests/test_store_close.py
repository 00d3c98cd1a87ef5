"""close() is final on every store and source: every later operation raises
StoreUnavailable saying the store is closed; the application's own pool or connection
stays open; closing twice is harmless; a connection that comes back after close() is
closed, never kept (async SQLite kept it).
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from idempotence import ClaimRequest, StoreUnavailable
from tests.support.sources import OnSource, open_on
from tests.support.stores import EventLoopThread

pytestmark = pytest.mark.timeout(30)


def _operations(store: Any, scope: str) -> dict[str, Callable[[], Any]]:
    def transaction() -> None:
        with store.transaction():
            pass

    return {
        "get": lambda: store.get(scope, "k"),
        "claim": lambda: store.claim(ClaimRequest(scope=scope, key="k", fingerprint="a" * 64)),
        "migrate": store.migrate,
        "transaction": transaction,
    }


def test_every_operation_after_close_raises_store_unavailable(on_source: OnSource) -> None:
    store, scope = on_source.store, f"close-{uuid.uuid4().hex[:12]}"
    assert store.get(scope, "k") is None
    store.close()
    operations = _operations(store, scope)
    refused = {}
    for name, operation in operations.items():
        try:
            operation()
        except StoreUnavailable as exc:
            refused[name] = "closed" in str(exc)
    assert refused == dict.fromkeys(operations, True)


def test_closing_twice_is_harmless_and_the_applications_own_stays_open(
    on_source: OnSource,
) -> None:
    on_source.store.get("close", "k")  # the store has used its source
    on_source.store.close()
    on_source.store.close()
    assert on_source.app_alive()


@pytest.mark.parametrize("source_id", ["sqlite-sync-file", "sqlite-async-file"])
def test_a_connection_back_after_close_is_closed(
    source_id: str, loop_thread: EventLoopThread, sqlite_path: str
) -> None:
    """A transaction still open at close() gives its connection back after it: the
    store closes it (async SQLite put it back among its idle connections)."""
    store = open_on(source_id, loop_thread, "", sqlite_path).store
    with store.transaction() as tx:
        raw = tx.connection
        store.close()
        tx.execute("SELECT 1")  # the open transaction still ends normally
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        raw.execute("SELECT 1")
