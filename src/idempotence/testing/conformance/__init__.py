"""The store conformance suite: the behaviour every key store promises, as pytest tests.

One call in a test module runs the whole suite on a store: pass the store's class and
a function that opens one, and bind the class it returns to a name pytest collects
(``Test...``):

```python
# tests/test_my_store.py
from idempotence.testing.conformance import suite
from my_package import MyStore

TestMyStore = suite(MyStore, lambda tmp_path: MyStore(tmp_path / "keys.db"))
```

The suite checks the claim and its outcomes in their order of precedence (mismatch,
replay, in progress, execute and take over: P1-P6), fencing by the lock token (F1),
heartbeats (F2), retention, errored keys, a key's status (its state; EXPIRED past its
retention before it is deleted, when it still replays); for a store that waits for a
twin, that the wait is bounded and changes nothing (P10), and for one that listens,
that the waiter is woken as the key settles; for a store that shares transactions
with the application, phases in one transaction (R2) and request-as-transaction (F3),
including transactions used past their block.

**The store's class** says what the store can do in its ``capabilities`` attribute
([`Capability`][idempotence.stores.capabilities.Capability]): the suite runs the tests of
a capability only on the stores that declare it, so a store without transactions
(as Redis) runs the key-store and waiting tests alone, none of them skipped. A store
without the attribute declares nothing beyond the key-store operations. One test
checks that the declaration matches the store: its operations for transactions and
for waiting, and a listening store's waiter back well before its wait runs out. When
the stores opened declare more than their class (a cached store in front of a
PostgreSQL store listens), say so with ``capabilities=``. An async store is driven
through a sync face, so its tests read the same.

**The opening function** is called for every test, and its parameters are pytest
fixtures, looked up by name as for a fixture (``tmp_path`` above; the conftest's
own fixtures too): take a database or a key prefix of the test's own there. It
returns a store whose schema is in place (migrated); the suite closes it after the
test. Every test works in a scope of its own.

**Aging a lock.** Some tests need a lock to expire or to be refreshed in time, which
takes up to a second of waiting each. Pass ``age_lock`` to move the lock's time into
the past instead: ``age_lock(store, scope, key, by)`` makes the lock of ``(scope,
key)`` ``by`` older, as if ``by`` had passed (on a SQL table, ``locked_at = locked_at
- by``); ``store`` is the store as the suite drives it (an async store behind the
sync face, whose ``transaction()`` is a plain ``with``). The key-status tests need a
finished key past its retention: pass ``age_key``, with the same signature, to move
every time the key recorded (created, locked, last run, finished, expires) back, or
they wait for a short retention to pass.

The suite needs pytest (the ``testing`` extra: ``pip install -e ".[testing]"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...stores.capabilities import Capability, capabilities_of
from . import _keys, _status, _transactions, _waits
from ._fixtures import fixtures_for
from ._support import AgeKey, AgeLock, required

__all__ = ["AgeKey", "AgeLock", "Capability", "suite"]


def suite(
    store_type: type[Any],
    open_store: Callable[..., Any],
    *,
    age_lock: AgeLock | None = None,
    age_key: AgeKey | None = None,
    capabilities: frozenset[Capability] | None = None,
) -> type[Any]:
    """The conformance suite for ``store_type``, as a test class to bind to a
    ``Test...`` name in a test module.

    Args:
        store_type: The store's class; its ``capabilities`` attribute (a set of
            [`Capability`][idempotence.stores.capabilities.Capability]) decides which tests
            run. Sync or async.
        open_store: Opens a migrated store for one test. Its parameters name pytest
            fixtures, which it receives.
        age_lock: Makes a key's lock older without waiting, as
            ``age_lock(store, scope, key, by)``; without it, the tests that need a
            lock to age wait for the time to pass.
        age_key: Makes a whole key older without waiting, as
            ``age_key(store, scope, key, by)``: every time it recorded, its
            expiry included; without it, the tests of a key past its retention
            wait for a short retention to pass.
        capabilities: What the stores ``open_store`` opens declare, when it is not
            what their class does (a
            [`CachedStore`][idempotence.stores.cached.CachedStore] has its primary's);
            None: the class's. Each store opened must declare at least these.

    Returns:
        A class of pytest tests, one per guarantee the store's capabilities cover.

    Raises:
        TypeError: When ``store_type`` is not a class, or (in the test) when
            ``open_store`` returns something else than a ``store_type``, or a store
            that declares less than the suite tests.

    Example:
        ```python
        from idempotence import SqliteStore
        from idempotence.testing.conformance import suite

        def open_store(tmp_path):
            store = SqliteStore(str(tmp_path / "keys.db"))
            store.migrate()
            return store

        TestSqlite = suite(SqliteStore, open_store)
        ```
    """
    if not isinstance(store_type, type):
        raise TypeError(
            f"suite() takes the store's class first, then the function that opens one; "
            f"got {store_type!r}"
        )
    if capabilities is None:
        capabilities = capabilities_of(store_type)
    namespace: dict[str, Any] = {
        "__doc__": f"The store conformance suite on {store_type.__qualname__}.",
        "__module__": getattr(open_store, "__module__", __name__),
    }
    for module in (_keys, _status, _waits, _transactions):
        for name, test in vars(module).items():
            if name.startswith("test_") and required(test) <= capabilities:
                namespace[name] = staticmethod(test)

    namespace.update(fixtures_for(store_type, open_store, age_lock, age_key, capabilities))
    return type(f"Test{store_type.__name__}Conformance", (), namespace)
