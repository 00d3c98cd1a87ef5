"""Moving time for a test: a key's times moved into the past, instead of a sleep.

Every store reads its times from its database's clock (DESIGN 3), so a test cannot
move that clock; it moves the key's recorded times back instead, which is the same
thing to the store. :class:`Rows` is where a store's records are (a SQL database, or
a Redis key prefix), and :meth:`Rows.backdate` is the one way the
suites age a key: the maintenance suites (a key past its retention or its grace
period), the consumer suites, and the conformance suite (``age_lock``, a lock past
its timeout).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import ModuleType
from typing import Any

import pytest

from idempotence.stores.capabilities import Capability
from idempotence.testing._blocking import Blocking
from tests.support.redis import SHARED_URL
from tests.support.sql_dialects import SQL

#: A record's time fields in a Redis hash (microseconds since the epoch), by column.
REDIS_FIELDS = {
    "locked_at": "locked",
    "created_at": "created",
    "last_run_at": "last_run",
    "finished_at": "finished",
    "expires_at": "expires",
}


def update(dialect: str, columns: tuple[str, ...], one_key: bool) -> str:
    """The UPDATE that moves ``columns`` back by ``:s`` seconds (``:us`` microseconds),
    on ``dialect`` (a SQL backend's name: tests/support/sql_dialects.py)."""
    spelt = SQL[dialect]
    sets = ", ".join(f"{c} = {spelt.aged.format(c=c)}" for c in columns)
    which = f" AND {spelt.key} = :key" if one_key else ""
    return f"UPDATE idempotency_keys SET {sets} WHERE scope = :scope{which}"


def age_lock(store: Any, scope: str, key: str, by: timedelta) -> None:
    """The conformance suite's ``age_lock`` for every store of the library: the lock
    of ``(scope, key)`` ``by`` older. A SQL store's row is updated in a transaction
    of the store's own (on the cached store, its primary's), a Redis record's hash
    field directly."""
    _age(store, scope, key, by, ("locked_at",))


def age_key(store: Any, scope: str, key: str, by: timedelta) -> None:
    """The conformance suite's ``age_key``: every time of ``(scope, key)`` ``by``
    older, its expiry included, as :func:`age_lock` moves its lock. A Redis record's
    TTL is left as it is: the record is then one whose expiry Redis has not acted on
    yet, as a SQL row past it is one the reaper has not deleted yet."""
    _age(store, scope, key, by, tuple(REDIS_FIELDS))


def _age(store: Any, scope: str, key: str, by: timedelta, columns: tuple[str, ...]) -> None:
    own = store.store if isinstance(store, Blocking) else store
    if Capability.TRANSACTIONS not in own.capabilities:  # Redis
        backdate_hash(SHARED_URL, own.record_key(scope, key), by, columns)
        return
    dialect = getattr(own, "primary", own)._dialect.name
    with store.transaction() as tx:
        tx.execute(
            update(dialect, columns, one_key=True),
            {
                "s": by.total_seconds(),
                "us": by // timedelta(microseconds=1),
                "scope": scope,
                "key": key,
            },
        )


def backdate_hash(url: str, name: bytes, by: timedelta, columns: tuple[str, ...]) -> None:
    """Move the ``columns`` of the Redis record ``name`` ``by`` into the past."""
    import redis

    micros = round(by.total_seconds() * 1_000_000)
    with redis.Redis.from_url(url) as client:
        present = client.hmget(name, [REDIS_FIELDS[c] for c in columns])
        moved = {
            REDIS_FIELDS[c]: int(value) - micros
            for c, value in zip(columns, present, strict=True)
            if value is not None
        }
        if moved:
            client.hset(name, mapping=moved)


@dataclass(frozen=True)
class Rows:
    """Where a store keeps its key records.

    ``backend`` is a SQL backend's name (tests/support/sql_dialects.py: ``url`` its
    URL, or a SQLite file's path) or ``"redis"`` (``url`` the server's URL and
    ``prefix`` the store's key prefix).
    """

    backend: str
    url: str
    prefix: str = ""

    def backdate(self, scope: str, key: str | None, by: timedelta, *columns: str) -> None:
        """Move the ``columns`` of one key (every key of ``scope`` if None) ``by``
        into the past, as if that much time had passed since they were written."""
        if self.backend == "redis":
            self._backdate_redis(scope, key, by, columns)
            return
        self.execute(
            re.sub(r":(\w+)", r"%(\1)s", update(self.backend, columns, key is not None)),
            {
                "s": by.total_seconds(),
                "us": by // timedelta(microseconds=1),
                "scope": scope,
                "key": key,
            },
        )

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run ``sql`` (with ``%(name)s`` parameters) on a connection of its own,
        committed; its rows."""
        if self.backend not in SQL:
            raise ValueError(f"no SQL on {self.backend}")
        return SQL[self.backend].execute(self.url, sql, params)

    def _backdate_redis(
        self, scope: str, key: str | None, by: timedelta, columns: tuple[str, ...]
    ) -> None:
        from idempotence.stores.redis import record_key

        if key is None:
            raise ValueError("a Redis record is aged one key at a time")
        backdate_hash(self.url, record_key(self.prefix, scope, key), by, columns)


def app_clock_ahead(monkeypatch: pytest.MonkeyPatch, by: timedelta, *modules: ModuleType) -> None:
    """The application's clock ``by`` ahead, as ``datetime.now`` in each of ``modules``:
    what a store computes from the application's clock instead of its database's
    (or server's) shows the difference."""

    class Ahead(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) + by

    for module in modules:
        monkeypatch.setattr(module, "datetime", Ahead)
