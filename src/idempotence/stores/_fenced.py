"""The refusal of a fenced write (F1), in the same words on every store, SQL or
key-value: the write named a lock token that is no longer the key's."""

from __future__ import annotations

from ..errors import LockLost
from ..states import Lease


def lost(lease: Lease, action: str) -> LockLost:
    """The [`LockLost`][idempotence.maintenance.completer_async.LockLost] for ``action``
    (``"finish"``, ``"release"``, ...) refused on ``lease``'s key."""
    return LockLost(
        f"cannot {action} key {lease.key!r} in scope {lease.scope!r}: lock token "
        f"{lease.token} is no longer current (another worker took the key over, or it "
        "is finished); this transaction must roll back",
        scope=lease.scope,
        key=lease.key,
        token=lease.token,
    )
