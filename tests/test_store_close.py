"""close() is final on every store and source: every later operation raises
StoreUnavailable saying the store is closed; the application's own pool or connection
stays open; closing twice is harmless; a connection that comes back after close() is
closed, never kept (async SQLite kept it).
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from idempotence import ClaimRequest, Lease, StoredResponse, StoreUnavailable
from tests.support.sources import OnSource, open_on
from tests.support.stores import EventLoopThread

pytestmark = pytest.mark.timeout(30)


def _operations(store: Any, scope: str, lease: Lease) -> dict[str, Callable[[], Any]]:
    """Every operation of the store; those of a key use ``lease``, taken before close."""

    def transaction() -> None:
        with store.transaction():
            pass

    return {
        "get": lambda: store.get(scope, "k"),
        "claim": lambda: store.claim(ClaimRequest(scope=scope, key="k", fingerprint="a" * 64)),
        "finish": lambda: store.finish(lease, StoredResponse.of(201)),
        "release": lambda: store.release(lease),
        "heartbeat": lambda: store.heartbeat(lease),
        "forget": lambda: store.forget(lease),
        "migrate": store.migrate,
        "transaction": transaction,
    }


def test_every_operation_after_close_raises_store_unavailable(on_source: OnSource) -> None:
    store, scope = on_source.store, f"close-{uuid.uuid4().hex[:12]}"
    assert store.get(scope, "k") is None
    lease = store.claim(ClaimRequest(scope=scope, key="held", fingerprint="a" * 64)).lease
    assert lease is not None
    store.close()
    operations = _operations(store, scope, lease)
    refused = {}
    for name, operation in operations.items():
        try:
            operation()
        except StoreUnavailable as exc:
            refused[name] = "closed" in str(exc)
    assert refused == dict.fromkeys(operations, True)
    # A wait hint never raises (the next claim reports a failure), nor hangs.
    started = time.monotonic()
    store.wait_for_settle(scope, "held", 0.1)
    assert time.monotonic() - started < 2


def test_closing_twice_is_harmless_and_the_applications_own_stays_open(
    on_source: OnSource,
) -> None:
    on_source.store.get("close", "k")  # the store has used its source
    on_source.store.close()
    on_source.store.close()
    assert on_source.app_alive()


@pytest.mark.parametrize(
    "source_id",
    ["sqlite-sync-file", "sqlite-async-file", "postgres-sync-url", "postgres-async-url"],
)
def test_a_connection_back_after_close_is_closed(
    source_id: str, loop_thread: EventLoopThread, pg_url: str, sqlite_path: str
) -> None:
    """A transaction still open at close() gives its connection back after it: the
    store closes it (async SQLite put it back among its idle connections)."""
    store = open_on(source_id, loop_thread, pg_url, sqlite_path).store
    with store.transaction() as tx:
        raw = tx.connection
        store.close()
        tx.execute("SELECT 1")  # the open transaction still ends normally
    if source_id.startswith("sqlite"):
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            raw.execute("SELECT 1")
    else:
        assert raw.closed
