"""What the conformance tests share: requests and responses, the application's own
table, the capability a test needs, and the clock that ages a lock."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from ...states import ClaimRequest, StoredResponse
from ...stores.capabilities import Capability

FP = "a" * 64
OTHER_FP = "b" * 64
SHORT = timedelta(milliseconds=300)
"""A lock timeout short enough for a test to expire it by moving it back ..."""
EXPIRED = SHORT + timedelta(milliseconds=100)
"""... this far (or, without ``age_lock``, by waiting this long)."""

AgeLock = Callable[[Any, str, str, timedelta], None]
"""How a test module ages a key's lock: ``(store, scope, key, by)`` moves the time the
lock was taken (or last extended) ``by`` into the past, as if that much time had
passed. ``store`` is the store as the tests drive it (an async store behind a sync
face with the same methods)."""

AgeKey = Callable[[Any, str, str, timedelta], None]
"""How a test module ages a whole key: ``(store, scope, key, by)`` moves every time
the key recorded (created, locked, last run, finished, expires) ``by`` into the past,
as if that much time had passed since they were written; a key past its retention
this way is one the reaper has not deleted yet."""

AGED_RETENTION = timedelta(hours=1)
"""The retention of a key a test ages past it with ``age_key``: long, so that a store
whose records expire on their own (a Redis TTL) still holds it when it is read ..."""
WAITED_RETENTION = timedelta(milliseconds=300)
"""... and of one it waits past, without ``age_key``."""

F = TypeVar("F", bound=Callable[..., Any])


def requires(*capabilities: Capability) -> Callable[[F], F]:
    """Mark a test as one that runs only on stores declaring ``capabilities``."""

    def mark(test: F) -> F:
        test.requires = frozenset(capabilities)  # type: ignore[attr-defined]
        return test

    return mark


def required(test: Callable[..., Any]) -> frozenset[Capability]:
    """The capabilities ``test`` needs (none: every store runs it)."""
    needs: frozenset[Capability] = getattr(test, "requires", frozenset())
    return needs


class Clock:
    """Makes a key's lock, or the whole key, older: through the test module's
    `AgeLock` and `AgeKey` when it has them, else by waiting for the time to pass
    (any store can be aged so, slowly).
    """

    def __init__(self, store: Any, age_lock: AgeLock | None, age_key: AgeKey | None) -> None:
        self._store = store
        self._age_lock = age_lock
        self._age_key = age_key

    @property
    def retention(self) -> timedelta:
        """A retention that `pass_retention` gets past."""
        return WAITED_RETENTION if self._age_key is None else AGED_RETENTION

    def pass_retention(self, scope: str, key: str) -> None:
        """Let the retention of ``(scope, key)`` (`retention`, counted from its
        finish) pass, and a moment more."""
        if self._age_key is None:
            time.sleep((WAITED_RETENTION + timedelta(milliseconds=100)).total_seconds())
        else:
            self._age_key(self._store, scope, key, AGED_RETENTION + timedelta(seconds=1))

    def pass_lock(self, scope: str, key: str, by: timedelta) -> None:
        """Let ``by`` pass for the lock of ``(scope, key)``."""
        if self._age_lock is None:
            time.sleep(by.total_seconds())
        else:
            self._age_lock(self._store, scope, key, by)


def request(scope: str, key: str = "key-1", fingerprint: str = FP, **kw: Any) -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint=fingerprint, **kw)


def response(n: int = 1) -> StoredResponse:
    return StoredResponse.of(201, {"content-type": "application/json"}, f'{{"n": {n}}}')


def make_side_table(store: Any) -> None:
    """A table for 'the application's own writes' in a phase."""
    with store.transaction() as tx:
        tx.execute("CREATE TABLE IF NOT EXISTS side_effects (scope TEXT NOT NULL, note TEXT)")


def side_notes(store: Any, scope: str) -> list[str]:
    with store.transaction() as tx:
        rows = tx.execute(
            "SELECT note FROM side_effects WHERE scope = :scope ORDER BY note",
            {"scope": scope},
        )
    return [row["note"] for row in rows]


def write_note(tx: Any, scope: str, note: str) -> None:
    tx.execute(
        "INSERT INTO side_effects (scope, note) VALUES (:scope, :note)",
        {"scope": scope, "note": note},
    )
