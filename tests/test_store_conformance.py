"""The store conformance suite (idempotence.testing.conformance: DESIGN 4, F1, F2, R2,
F3) on every store the library ships, sync and async, on real databases: PostgreSQL,
SQLite and Redis here; the cached store in tests/test_store_cached_conformance.py,
the SQLAlchemy stores in tests/sqla/test_conformance.py, the Django store in
tests/django_orm/test_conformance.py.

Each store's class declares its capabilities, and the suite runs what they cover:
Redis, without transactions, runs the key-store tests. Locks are aged by moving their
time back (tests/support/clock.py), not by waiting.
"""

from __future__ import annotations

import pytest

from idempotence.testing.conformance import suite
from tests.support.clock import age_key, age_lock
from tests.support.stores import STORES

# The fast tier runs one pass per backend; the other flavour is the slow tier's.
TestPostgres = suite(*STORES["postgres-sync"], age_lock=age_lock, age_key=age_key)
TestAsyncPostgres = pytest.mark.slow(
    suite(*STORES["postgres-async"], age_lock=age_lock, age_key=age_key)
)
TestSqlite = pytest.mark.slow(suite(*STORES["sqlite-sync"], age_lock=age_lock, age_key=age_key))
TestAsyncSqlite = suite(*STORES["sqlite-async"], age_lock=age_lock, age_key=age_key)
TestRedis = suite(*STORES["redis-sync"], age_lock=age_lock, age_key=age_key)
TestAsyncRedis = pytest.mark.slow(suite(*STORES["redis-async"], age_lock=age_lock, age_key=age_key))
