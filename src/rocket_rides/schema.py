"""Rocket Rides' own tables: users (API keys), rides, audit records and the receipts
that the guarded message consumer writes (``--broker``).

They live in the key store's database, so a phase's writes commit with its checkpoint
(R2), and rides and audit records reference the key row that created them (DESIGN 3),
``ON DELETE SET NULL``, so the reaper can delete old keys without touching the rides.

There is deliberately no ``UNIQUE (user_id, key_id)`` on rides: the demo exists to
*measure* exactly-once, and a constraint would turn a second ride into a quiet 500
instead of a number in the report. An application would add it as a second line of
defence.

SQL in this package is written with ``:name`` placeholders, which the store's
transaction takes on every database.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from idempotence.database import open_sql_store
from idempotence.stores import Transaction

__all__ = [
    "DECLINED_CARD",
    "STANDARD_CARD",
    "USERS",
    "User",
    "dialect_of",
    "fetch",
    "prepare",
    "seed_users",
]

USERS = 100
"""Seeded users: ``user-1`` … ``user-100``, each with a ``-declined`` twin."""
STANDARD_CARD = "tok_visa"
DECLINED_CARD = "tok_visa_declined"
"""[`FakeProvider`][idempotence.testing.provider.FakeProvider] declines every card whose
name ends so."""

Dialect = Literal["sqlite", "postgres"]


@dataclass(frozen=True, slots=True)
class User:
    """A rider: the id scopes their idempotency keys, the API key authenticates them."""

    id: str
    api_key: str
    card: str


def seed_users(count: int = USERS) -> list[User]:
    """``user-N`` pays with a good card; ``user-N-declined`` with one that is declined.

    ```python
    [u.api_key for u in seed_users(1)]
    # ['user-1', 'user-1-declined']
    ```
    """
    users = []
    for n in range(1, count + 1):
        users.append(User(f"usr_{n}", f"user-{n}", STANDARD_CARD))
        users.append(User(f"usr_{n}_declined", f"user-{n}-declined", DECLINED_CARD))
    return users


def dialect_of(tx: Any) -> Dialect:
    """Which SQL dialect the transaction ``tx`` (sync or async) speaks."""
    return "sqlite" if isinstance(tx.connection, sqlite3.Connection) else "postgres"


def fetch(tx: Transaction, text: str, params: Mapping[str, Any] | None = None) -> list[Any]:
    """Run ``text`` on a sync transaction and return its rows (dicts)."""
    return tx.execute(text, dict(params or {}))


_TABLES: dict[Dialect, list[str]] = {
    "postgres": [
        """CREATE TABLE IF NOT EXISTS rocket_users (
            id      text PRIMARY KEY,
            api_key text NOT NULL UNIQUE,
            card    text NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS rocket_rides (
            id          bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            user_id     text    NOT NULL REFERENCES rocket_users (id),
            key_id      bigint,
            -- The client's Idempotency-Key, kept after the key row is reaped: the
            -- reconciliation finds a run's rides by it.
            request_key text    NOT NULL,
            origin_lat  double precision NOT NULL,
            origin_lon  double precision NOT NULL,
            target_lat  double precision NOT NULL,
            target_lon  double precision NOT NULL,
            amount      integer NOT NULL,
            currency    text    NOT NULL,
            status      text    NOT NULL,
            charge_id   text,
            created_at  timestamptz NOT NULL DEFAULT now(),
            FOREIGN KEY (user_id, key_id) REFERENCES idempotency_keys (scope, id)
                ON DELETE SET NULL (key_id)
        )""",
        "CREATE INDEX IF NOT EXISTS rocket_rides_user_idx ON rocket_rides (user_id, id)",
        "CREATE INDEX IF NOT EXISTS rocket_rides_key_idx ON rocket_rides (user_id, key_id)",
        """CREATE TABLE IF NOT EXISTS rocket_audit_records (
            id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            user_id    text   NOT NULL,
            key_id     bigint,
            ride_id    bigint NOT NULL REFERENCES rocket_rides (id),
            action     text   NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            FOREIGN KEY (user_id, key_id) REFERENCES idempotency_keys (scope, id)
                ON DELETE SET NULL (key_id)
        )""",
        "CREATE INDEX IF NOT EXISTS rocket_audit_ride_idx ON rocket_audit_records (ride_id)",
        # Receipts the guarded consumer writes (--broker). No UNIQUE, as on rides: a
        # second receipt must show in the report, not fail quietly.
        """CREATE TABLE IF NOT EXISTS rocket_receipts (
            id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            message_id text   NOT NULL,
            ride_id    bigint NOT NULL REFERENCES rocket_rides (id),
            user_id    text   NOT NULL,
            charge_id  text,
            sent_at    double precision NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS rocket_receipts_ride_idx ON rocket_receipts (ride_id)",
    ],
    "sqlite": [
        """CREATE TABLE IF NOT EXISTS rocket_users (
            id      TEXT PRIMARY KEY,
            api_key TEXT NOT NULL UNIQUE,
            card    TEXT NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS rocket_rides (
            id          INTEGER PRIMARY KEY,
            user_id     TEXT    NOT NULL REFERENCES rocket_users (id),
            key_id      INTEGER REFERENCES idempotency_keys (id) ON DELETE SET NULL,
            request_key TEXT    NOT NULL,
            origin_lat  REAL    NOT NULL,
            origin_lon  REAL    NOT NULL,
            target_lat  REAL    NOT NULL,
            target_lon  REAL    NOT NULL,
            amount      INTEGER NOT NULL,
            currency    TEXT    NOT NULL,
            status      TEXT    NOT NULL,
            charge_id   TEXT,
            created_at  TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP
        )""",
        "CREATE INDEX IF NOT EXISTS rocket_rides_user_idx ON rocket_rides (user_id, id)",
        "CREATE INDEX IF NOT EXISTS rocket_rides_key_idx ON rocket_rides (user_id, key_id)",
        """CREATE TABLE IF NOT EXISTS rocket_audit_records (
            id         INTEGER PRIMARY KEY,
            user_id    TEXT    NOT NULL,
            key_id     INTEGER REFERENCES idempotency_keys (id) ON DELETE SET NULL,
            ride_id    INTEGER NOT NULL REFERENCES rocket_rides (id),
            action     TEXT    NOT NULL,
            created_at TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP
        )""",
        "CREATE INDEX IF NOT EXISTS rocket_audit_ride_idx ON rocket_audit_records (ride_id)",
        """CREATE TABLE IF NOT EXISTS rocket_receipts (
            id         INTEGER PRIMARY KEY,
            message_id TEXT    NOT NULL,
            ride_id    INTEGER NOT NULL REFERENCES rocket_rides (id),
            user_id    TEXT    NOT NULL,
            charge_id  TEXT,
            sent_at    REAL    NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS rocket_receipts_ride_idx ON rocket_receipts (ride_id)",
    ],
}


def prepare(database: str) -> None:
    """Migrate the key store at ``database``, create the tables and seed the users.

    Safe to run again on a prepared database: nothing is created or seeded twice.
    """
    with open_sql_store(database) as store:
        store.migrate()
        with store.transaction() as tx:
            dialect = dialect_of(tx)
            if dialect == "postgres":
                # Two demos preparing one database at once must not race on DDL.
                tx.execute("SELECT pg_advisory_xact_lock(7294158303)")
            for statement in _TABLES[dialect]:
                tx.execute(statement)
            for user in seed_users():
                fetch(
                    tx,
                    "INSERT INTO rocket_users (id, api_key, card) VALUES (:id, :api_key, :card)"
                    " ON CONFLICT (id) DO NOTHING",
                    {"id": user.id, "api_key": user.api_key, "card": user.card},
                )
