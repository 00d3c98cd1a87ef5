"""``@idempotent`` refuses what cannot work when it decorates, not at a call."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from idempotence import (
    AsyncSqliteStore,
    ConfigurationError,
    InvalidKey,
    MissingKey,
    SqliteStore,
    StoreUnavailable,
    current_call,
    idempotent,
)
from idempotence.observability import Instrumentation, Watch


@pytest.fixture
def store(sqlite_path: str) -> Any:
    with SqliteStore(sqlite_path) as opened:
        yield opened


def test_a_key_naming_no_parameter_is_refused_at_decoration(store: SqliteStore) -> None:
    with pytest.raises(ConfigurationError, match=r"key='order_idd' names no parameter"):

        @idempotent(store, key="order_idd")
        def charge(order_id: str) -> int:
            return 1

    with pytest.raises(ConfigurationError, match="fingerprint_exclude"):

        @idempotent(store, key="order_id", fingerprint_exclude=["nope"])
        def charge_too(order_id: str) -> int:
            return 1


def test_a_return_type_that_cannot_be_stored_is_refused_at_decoration(
    store: SqliteStore,
) -> None:
    with pytest.raises(ConfigurationError, match="serializer=") as caught:

        @idempotent(store, key="order_id")
        def connect(order_id: str) -> socket.socket:
            raise AssertionError("never called")

    assert "socket" in str(caught.value)
    # Which function: an application decorates many, and the return type alone may not
    # say which one to fix.
    assert "@idempotent on tests.functions.test_decoration" in str(caught.value)
    assert ".connect:" in str(caught.value)

    @idempotent(store, key="order_id", serializer=(lambda s: None, lambda j: None))
    def with_a_serializer(order_id: str) -> socket.socket:
        raise AssertionError("never called")


def test_a_store_of_the_other_flavour_is_refused(store: SqliteStore, sqlite_path: str) -> None:
    with pytest.raises(ConfigurationError, match="AsyncStore for async def"):

        @idempotent(store, key="k")
        async def later(k: str) -> int:
            return 1

    with pytest.raises(ConfigurationError, match="Store for def"):

        @idempotent(AsyncSqliteStore(sqlite_path), key="k")
        def now(k: str) -> int:
            return 1


def test_transactional_needs_a_sql_store(redis_url: str, redis_prefix: str) -> None:
    from idempotence.stores.redis import RedisStore

    redis_store = RedisStore(redis_url, prefix=redis_prefix)
    with redis_store, pytest.raises(ConfigurationError, match="transactional=True needs"):

        @idempotent(redis_store, key="k", transactional=True)
        def place(k: str) -> int:
            return 1


def test_keys_by_path_and_callable_and_scopes(store: SqliteStore) -> None:
    seen: list[Any] = []

    @idempotent(store, key="order.ref", scope="order.account")
    def by_path(order: dict[str, Any]) -> str:
        seen.append(current_call())
        return order["ref"]

    assert by_path({"ref": "r-1", "account": "acct_9"}) == "r-1"
    assert (seen[0].scope, seen[0].key) == ("acct_9", "r-1")
    assert store.get("acct_9", "r-1") is not None

    @idempotent(store, key=lambda order_id, **_: f"order-{order_id}")
    def by_callable(order_id: int) -> int:
        seen.append(current_call())
        return order_id

    assert by_callable(42) == 42
    assert seen[1].key == "order-42"
    assert seen[1].scope.endswith("test_keys_by_path_and_callable_and_scopes.<locals>.by_callable")
    with pytest.raises(MissingKey, match="its key= gave None"):
        by_path({"ref": None, "account": "a"})
    with pytest.raises(InvalidKey, match="this call's key is too long: 300 characters") as bad:
        by_path({"ref": "x" * 300, "account": "a"})
    # A function has arguments, not headers: the message speaks of its key.
    assert "Idempotency-Key" not in str(bad.value)
    with pytest.raises(InvalidKey, match="this call's key is empty") as bad:
        by_path({"ref": "", "account": "a"})
    assert "Idempotency-Key" not in str(bad.value)
    with pytest.raises(LookupError, match="only available inside a guarded function"):
        current_call()


def test_current_call_is_the_innermost_guarded_call_and_the_outer_one_after(
    store: SqliteStore,
) -> None:
    """The context is made when asked: a nested guarded call sees its own, and the
    outer call sees its own again once the inner one returned."""
    seen: dict[str, Any] = {}

    @idempotent(store, key="ref", name="inner")
    def inner(ref: str) -> str:
        seen["inner"] = current_call()
        return current_call().key_for("x")

    @idempotent(store, key="ref", name="outer")
    def outer(ref: str) -> str:
        before = current_call()
        derived = inner(f"in-{ref}")
        seen["outer"], seen["after"] = before, current_call()
        return derived

    derived = outer("o-1")
    outer_call, inner_call = seen["outer"], seen["inner"]
    assert seen["after"] is outer_call  # made once per call, and current again
    assert (outer_call.name, outer_call.key) == ("outer", "o-1")
    assert (inner_call.name, inner_call.key) == ("inner", "in-o-1")
    assert derived == f"inner-{inner_call.lease.id}-x"
    assert inner_call.lease.id != outer_call.lease.id
    with pytest.raises(LookupError, match="only available inside a guarded function"):
        current_call()


def test_an_unreachable_store_fails_closed_and_the_body_never_runs() -> None:
    from idempotence.stores.redis import RedisStore

    ran: list[str] = []
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with RedisStore(f"redis://127.0.0.1:{port}/0") as down:

        @idempotent(down, key="k")
        def charge(k: str) -> int:
            ran.append(k)
            return 1

        with pytest.raises(StoreUnavailable):
            charge("k1")
    assert ran == []


class _Runs(Instrumentation):
    def __init__(self) -> None:
        self.runs: list[tuple[str, str]] = []

    def run(self, flow: str, request: Any) -> Watch[Any]:
        runs = self.runs

        class _Watch(Watch[Any]):
            def done(self, result: Any) -> Any:
                runs.append((flow, result.kind.value))
                return result

        return _Watch()


def test_each_call_is_reported_as_a_run_of_the_function(sqlite_path: str) -> None:
    instrumentation = _Runs()
    with SqliteStore(sqlite_path, instrumentation=instrumentation) as store:

        @idempotent(store, key="k", name="charges")
        def charge(k: str) -> int:
            return 1

        charge("a"), charge("a")
    assert instrumentation.runs == [("charges", "executed"), ("charges", "replayed")]


def test_an_opener_is_called_once_at_the_first_call(sqlite_path: str) -> None:
    opened: list[AsyncSqliteStore] = []

    def open_store() -> AsyncSqliteStore:
        opened.append(AsyncSqliteStore(sqlite_path))
        return opened[-1]

    @idempotent(open_store, key="k")
    async def charge(k: str) -> int:
        return 1

    assert opened == []

    async def twice() -> None:
        assert await charge("a") == 1
        assert await charge("a") == 1
        await opened[0].close()

    asyncio.run(twice())
    assert len(opened) == 1


def test_a_dotted_path_is_cut_from_the_fingerprint(store: SqliteStore) -> None:
    from idempotence import ArgumentsMismatch

    runs: list[str] = []

    @idempotent(store, key="order.ref", fingerprint_exclude=["order.meta.sent_at"])
    def place(order: dict[str, Any]) -> int:
        runs.append(order["ref"])
        return int(order["amount"])

    assert place({"ref": "r-1", "amount": 5, "meta": {"sent_at": 1}}) == 5
    assert place({"ref": "r-1", "amount": 5, "meta": {"sent_at": 2}}) == 5  # a retry
    with pytest.raises(ArgumentsMismatch):
        place({"ref": "r-1", "amount": 6, "meta": {"sent_at": 3}})
    assert runs == ["r-1"]
