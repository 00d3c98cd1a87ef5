"""What a store can do beyond the key-store operations every store honours.

Every store claims, finishes, releases, heartbeats, forgets and reads keys (the
[`KeyStore`][idempotence.stores.keyvalue.KeyStore] operations, P1-P5, F1, F2). Some can do
more, and say so in a ``capabilities`` attribute, a frozenset of
[`Capability`][idempotence.stores.capabilities.Capability]:

```python
from idempotence import SqliteStore
from idempotence.stores.capabilities import Capability, capabilities_of

assert Capability.TRANSACTIONS in SqliteStore.capabilities
assert Capability.LISTENING not in capabilities_of(SqliteStore(":memory:"))
```

The class's attribute says what its stores do as they are usually built; a store built
otherwise says so in its own attribute, which is the last word:
[`capabilities_of`][idempotence.stores.capabilities.capabilities_of] reads it. A
PostgreSQL store on the application's one connection has no connection of its own to
LISTEN on, and drops [`LISTENING`][idempotence.stores.capabilities.Capability.LISTENING];
a cached store has what its primary has.

Code that needs a capability checks it instead of naming store classes, and so does the
conformance suite
([`idempotence.testing.conformance`][idempotence.testing.conformance]): it runs the
tests of a capability on the stores that declare it, and only there.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Capability", "capabilities_of"]


class Capability(StrEnum):
    """One thing a store can do beyond the key-store operations."""

    TRANSACTIONS = "transactions"
    """Transactions shared with the application's writes: ``transaction()`` (whose
    ``execute`` runs the application's SQL with ``:name`` parameters on the key
    table's database), ``claim(tx=)``, ``finish(tx=, at_commit=)``,
    ``checkpoint`` and ``end_phase``. Flows with atomic phases (R2) and
    request-as-transaction endpoints (F3) need it. The SQL stores have it; Redis,
    whose every operation is one script, has not."""

    WAITING = "waiting"
    """Holding a racing duplicate while its twin's key is in progress (P10):
    ``wait_for_settle(scope, key, seconds)`` waits at most ``seconds`` for the key to
    settle (finished, released, forgotten) and may return early; the caller then
    claims again. A request with a wait policy calls it between its claims; on a
    store without it, the engine sleeps between the claims instead. A store that polls
    sleeps out the bound; one that also has
    [`LISTENING`][idempotence.stores.capabilities.Capability.LISTENING] returns as the
    key settles. Every store of the library has it."""

    LISTENING = "listening"
    """Waiting (P10) woken by the database the moment the key settles, rather than by
    the caller's next poll: PostgreSQL's LISTEN/NOTIFY, Redis pub/sub. A waiter
    returns a moment after the finish however long its bound. Implies
    [`WAITING`][idempotence.stores.capabilities.Capability.WAITING]. SQLite and
    MariaDB have no notifications: their waits sleep out their bound, and a duplicate
    learns of the settled key at its next claim."""


def capabilities_of(store: object) -> frozenset[Capability]:
    """What ``store`` (a store, or a store's class) declares it can do: its
    ``capabilities`` attribute, or nothing beyond the key-store operations when it
    has none.

    Args:
        store: A key store, sync or async, or its class. An instance's own attribute
            wins over its class's (see the module docstring).

    Returns:
        The declared capabilities.

    Raises:
        TypeError: When the attribute holds something else than capabilities.
    """
    declared: object = getattr(store, "capabilities", frozenset())
    if isinstance(declared, frozenset | set) and all(isinstance(c, Capability) for c in declared):
        return frozenset(declared)
    owner = store if isinstance(store, type) else type(store)
    raise TypeError(
        f"{owner.__qualname__}.capabilities must be a frozenset of "
        f"idempotence.stores.capabilities.Capability, not {declared!r}"
    )
