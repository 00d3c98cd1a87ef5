"""What a store can do beyond the key-store operations every store honours.

Every store claims, finishes, releases, heartbeats, forgets and reads keys (the
[`KeyStore`][idempotence.stores.keyvalue.KeyStore] operations, P1-P5, F1, F2). Some can do
more, and say so in a ``capabilities`` class attribute, a frozenset of
[`Capability`][idempotence.stores.capabilities.Capability]:

```python
from idempotence import SqliteStore
from idempotence.stores.capabilities import Capability

assert Capability.TRANSACTIONS in SqliteStore.capabilities
```

Code that needs a capability checks it instead of naming store classes, and so does the
conformance suite
([`idempotence.testing.conformance`][idempotence.testing.conformance]): it runs the
tests of a capability on the stores that declare it, and only there.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Capability"]


class Capability(StrEnum):
    """One thing a store can do beyond the key-store operations."""

    TRANSACTIONS = "transactions"
    """Transactions shared with the application's writes: ``transaction()`` (whose
    ``execute`` runs the application's SQL with ``:name`` parameters on the key
    table's database), ``claim(tx=)``, ``finish(tx=, at_commit=)``,
    ``checkpoint`` and ``end_phase``. Flows with atomic phases (R2) and
    request-as-transaction endpoints (F3) need it. The SQL stores have it; Redis,
    whose every operation is one script, has not."""
