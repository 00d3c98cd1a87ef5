"""Store capabilities (issue 31): what each store declares, what an instance built
otherwise declares, that the library decides by the declaration and not by a store's
class, and that the conformance suite's capability tests fail on a store that
declares what it cannot do."""

from __future__ import annotations

import time
from typing import Any, ClassVar

import psycopg
import pytest

from idempotence import ClaimRequest, SqliteStore
from idempotence.errors import ConfigurationError
from idempotence.flows import _driver
from idempotence.flows.effects import DoWait
from idempotence.http import Idempotency, Policy, single_tenant
from idempotence.stores.cached import CachedStore
from idempotence.stores.capabilities import Capability, capabilities_of
from idempotence.stores.postgres import PostgresStore
from idempotence.testing.conformance import _keys, _waits
from tests.support.keystores import NoSharedTransactions

SQL_POLLING = {Capability.TRANSACTIONS, Capability.WAITING}


def test_every_store_class_declares_what_it_does() -> None:
    from idempotence.contrib.django_app.store import DjangoStore
    from idempotence.contrib.sqlalchemy import AsyncSQLAlchemyStore, SQLAlchemyStore
    from idempotence.stores.cached import AsyncCachedStore
    from idempotence.stores.mariadb import AsyncMariaDBStore, MariaDBStore
    from idempotence.stores.postgres import AsyncPostgresStore
    from idempotence.stores.redis import AsyncRedisStore, RedisStore
    from idempotence.stores.sqlite import AsyncSqliteStore

    listening = SQL_POLLING | {Capability.LISTENING}
    declared = {
        PostgresStore: listening,
        AsyncPostgresStore: listening,
        SqliteStore: SQL_POLLING,
        AsyncSqliteStore: SQL_POLLING,
        MariaDBStore: SQL_POLLING,
        AsyncMariaDBStore: SQL_POLLING,
        RedisStore: {Capability.WAITING, Capability.LISTENING},
        AsyncRedisStore: {Capability.WAITING, Capability.LISTENING},
        CachedStore: SQL_POLLING,  # whatever the primary; an instance has its primary's
        AsyncCachedStore: SQL_POLLING,
        SQLAlchemyStore: SQL_POLLING,
        AsyncSQLAlchemyStore: SQL_POLLING,
        DjangoStore: SQL_POLLING,
    }
    assert {cls: capabilities_of(cls) for cls in declared} == declared


def test_an_instance_says_what_it_does_when_built_otherwise(pg_url: str, redis_url: str) -> None:
    # On a pool it opened, the PostgreSQL store has a connection of its own to LISTEN on;
    # on the application's one connection it has none, and polls. A cached store has
    # its primary's capabilities.
    pooled = PostgresStore(pg_url)
    with CachedStore(pooled, redis_url, prefix="capabilities-test") as cached:
        assert Capability.LISTENING in capabilities_of(pooled)
        assert capabilities_of(cached) == capabilities_of(pooled)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        single = PostgresStore(conn)
        with CachedStore(single, redis_url, prefix="capabilities-test") as cached:
            assert capabilities_of(single) == SQL_POLLING
            assert capabilities_of(cached) == SQL_POLLING
    assert Capability.LISTENING in PostgresStore.capabilities  # the class's is unchanged


def test_a_declaration_that_is_not_capabilities_is_refused() -> None:
    class Wrong:
        capabilities: ClassVar[Any] = {"transactions"}

    with pytest.raises(TypeError, match=r"Wrong\.capabilities must be a frozenset of .*Capability"):
        capabilities_of(Wrong)
    assert capabilities_of(object()) == frozenset()  # no attribute: nothing more


# -- the library decides by the declaration ---------------------------------------------


class _NoTransactions(SqliteStore):
    """A SQL store that does not declare its transactions: the library takes it at its
    word."""

    capabilities = frozenset({Capability.WAITING})


def test_http_refuses_a_transaction_endpoint_on_a_store_without_the_capability(
    sqlite_path: str,
) -> None:
    with _NoTransactions(sqlite_path) as store, pytest.raises(ConfigurationError, match="cannot"):
        Idempotency(store=store, scope=single_tenant("t"), default=Policy(transaction=True))
    with SqliteStore(sqlite_path) as store:
        Idempotency(store=store, scope=single_tenant("t"), default=Policy(transaction=True))


class _Counted(NoSharedTransactions):
    """A key store whose waits are counted (on a real SQLite store underneath)."""

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self.waits = 0

    def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        self.waits += 1
        super().wait_for_settle(scope, key, seconds)


def test_the_engine_asks_only_a_waiting_store_to_wait(sqlite_path: str, scope: str) -> None:
    request = ClaimRequest(scope=scope, key="k", fingerprint="f" * 64)
    with SqliteStore(sqlite_path) as inner:
        store = _Counted(inner)
        _driver.perform(DoWait(request, 0.01), store, None)
        assert store.waits == 1
        store.capabilities = frozenset()  # declares no waiting: the driver sleeps instead
        started = time.monotonic()
        _driver.perform(DoWait(request, 0.05), store, None)
        assert store.waits == 1
        assert time.monotonic() - started >= 0.05


# -- the suite's capability tests can fail ------------------------------------------------


class _PretendsToListen(SqliteStore):
    """SQLite, whose waits sleep out their bound, declaring that it listens."""

    capabilities = SqliteStore.capabilities | {Capability.LISTENING}


def test_the_listening_test_fails_on_a_polling_store_that_declares_it(
    sqlite_path: str, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_waits, "LONG", 3.0)  # still twice PROMPT, and a shorter failure
    declared = r"declares Capability\.LISTENING"
    with _PretendsToListen(sqlite_path) as store, pytest.raises(AssertionError, match=declared):
        _waits.test_p10_a_listening_store_wakes_the_waiter_as_the_key_settles(store, scope)
    # ... and passes on a store that listens (the conformance modules run it on each).


def test_the_declaration_test_fails_on_a_store_that_declares_what_it_has_not(
    sqlite_path: str,
) -> None:
    with SqliteStore(sqlite_path) as store:
        honest = capabilities_of(store)
        _keys.test_the_store_has_the_operations_of_what_it_declares(store, honest)
        wrong: list[Any] = [
            honest - {Capability.WAITING},  # it has wait_for_settle
            honest - {Capability.TRANSACTIONS},  # it has transaction()
            frozenset({Capability.TRANSACTIONS, Capability.LISTENING}),  # listens, no wait
        ]
        for declared in wrong:
            with pytest.raises(AssertionError, match="declare Capability"):
                _keys.test_the_store_has_the_operations_of_what_it_declares(store, declared)


def test_the_bounded_wait_test_fails_on_a_wait_past_its_bound(
    sqlite_path: str, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Oversleeps(SqliteStore):
        def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
            super().wait_for_settle(scope, key, seconds * 10)

    monkeypatch.setattr(_waits, "PROMPT", 0.5)
    with Oversleeps(sqlite_path) as store, pytest.raises(AssertionError, match="wait bounded by"):
        _waits.test_p10_a_wait_for_a_key_in_progress_ends_by_its_bound(store, scope + "-over")
