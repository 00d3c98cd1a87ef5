"""One nesting rule on every store and source: inside a store's open transaction, an
operation that needs a connection of its own raises StoreInTransaction at once.

Before the rule the stores drifted apart: async SQLite on ``:memory:`` or an
application's connection deadlocked on its one slot, SQLite on a file waited forever
on the writer lock for a write, and the others ran the operation on another
connection, or inside the open transaction. Operations given ``tx=`` are untouched.
A short timeout turns a hang back into a failure.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from idempotence import (
    AsyncSqliteStore,
    ClaimRequest,
    ConfigurationError,
    Lease,
    StoredResponse,
    StoreInTransaction,
)
from tests.support.sources import OWNED_POOLS, SOURCES, OnSource, open_on
from tests.support.stores import EventLoopThread

pytestmark = pytest.mark.timeout(30)


def request(scope: str, key: str = "k") -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint="a" * 64, lock_timeout=timedelta(hours=1))


def response() -> StoredResponse:
    return StoredResponse.of(201, {"content-type": "text/plain"}, "done")


def hold(store: Any, scope: str, key: str = "k") -> Lease:
    lease = store.claim(request(scope, key)).lease
    assert isinstance(lease, Lease)
    return lease


def _own_operations(store: Any, scope: str, lease: Lease) -> dict[str, Callable[[], Any]]:
    """Every operation that runs on a connection of the store's own."""

    def second_transaction() -> None:
        with store.transaction():
            pass

    return {
        "get": lambda: store.get(scope, "k"),
        "claim": lambda: store.claim(request(scope, "other")),
        "finish": lambda: store.finish(lease, response()),
        "release": lambda: store.release(lease),
        "heartbeat": lambda: store.heartbeat(lease),
        "forget": lambda: store.forget(lease),
        "migrate": store.migrate,
        "transaction": second_transaction,
    }


def test_a_read_inside_the_stores_transaction_raises_at_once(on_source: OnSource) -> None:
    """Drift 1: async SQLite on one connection deadlocked here on its single slot."""
    store, scope = on_source.store, _scope()
    with store.transaction(), pytest.raises(StoreInTransaction, match="tx="):
        store.get(scope, "k")
    assert store.get(scope, "k") is None  # after the transaction: fine


def test_a_write_inside_the_stores_transaction_raises_at_once(on_source: OnSource) -> None:
    """Drift 2: on a SQLite file a finish waited forever on the writer lock."""
    store, scope = on_source.store, _scope()
    lease = hold(store, scope)
    with store.transaction():
        with pytest.raises(StoreInTransaction):
            store.finish(lease, response())
        with pytest.raises(StoreInTransaction):
            store.claim(request(scope, "other"))
    # Nothing was done: the key is still ours to finish, the other never claimed.
    assert store.get(scope, "other") is None
    store.finish(lease, response())
    assert store.get(scope, "k").response is not None  # finished


def test_every_operation_without_tx_is_refused_and_the_transaction_goes_on(
    on_source: OnSource,
) -> None:
    store, scope = on_source.store, _scope()
    lease = hold(store, scope)
    with store.transaction() as tx:
        for name, operation in _own_operations(store, scope, lease).items():
            with pytest.raises(StoreInTransaction) as refused:
                operation()
            assert isinstance(refused.value, ConfigurationError), name
        # Given tx=, the same operations run in the transaction, as before.
        store.finish(lease, response(), tx=tx)
    assert store.get(scope, "k").response is not None  # finished


def test_operations_given_tx_run_in_the_transaction(on_source: OnSource) -> None:
    store, scope = on_source.store, _scope()
    with store.transaction(claim=request(scope)) as tx:
        assert tx.claim.lease is not None
        store.finish(tx.claim.lease, response(), tx=tx)
    assert store.get(scope, "k").response is not None  # finished


@pytest.mark.parametrize("source_id", [s for s in SOURCES if s.endswith(OWNED_POOLS)])
def test_another_thread_is_not_refused(
    source_id: str, loop_thread: EventLoopThread, pg_url: str, sqlite_path: str
) -> None:
    """The rule is per thread (task): another thread takes its own turn, and on a
    store with connections to spare it does not even wait."""
    store, scope = open_on(source_id, loop_thread, pg_url, sqlite_path).store, _scope()
    got: list[Any] = []
    try:
        with store.transaction():
            reader = threading.Thread(target=lambda: got.append(store.get(scope, "k")))
            reader.start()
            reader.join(timeout=20)
            assert not reader.is_alive()
    finally:
        store.close()
    assert got == [None]


def test_one_asyncio_task_is_refused_another_is_not() -> None:
    """The rule follows the task, not the store: drift 1 as an application meets it."""

    async def scenario() -> None:
        store = AsyncSqliteStore(":memory:")
        await store.migrate()
        scope = _scope()
        try:
            async with store.transaction():
                with pytest.raises(StoreInTransaction):
                    await store.get(scope, "k")
                # Another task waits its turn for the one connection: it must not be
                # refused, and gets it once the transaction ends.
                other = asyncio.get_running_loop().create_task(
                    store.get(scope, "k"), context=contextvars.Context()
                )
                await asyncio.sleep(0.05)
                assert not other.done()
            assert await asyncio.wait_for(other, 10) is None
        finally:
            await store.close()

    asyncio.run(scenario())


def _scope() -> str:
    return f"nest-{uuid.uuid4().hex[:12]}"
