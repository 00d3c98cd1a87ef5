"""The operator's view of the key store (F5): list, show and evict keys, and counts.

The state of every key is computed in SQL exactly as
[`idempotence.key_state`][idempotence.maintenance.admin.key_state] computes it (the test
suite holds the two together), so that ``--state`` filters before ``--limit`` and a
listing never disagrees with the state machine. On a
[`RedisStore`][idempotence.stores.redis.RedisStore] the records are found by SCAN (never
KEYS) and classified by
[`idempotence.key_state`][idempotence.maintenance.admin.key_state] itself, on the
server's clock.

```python
rows = list_keys(store, state=KeyState.ERRORED, limit=20)
stats(store).states[KeyState.PENDING]
# 4
```
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..errors import KeyIsLocked, KeyNotFound
from ..states import KeyRecord, KeyState, key_state
from ..stores import Store
from . import _ops
from ._ops import KeyRow, StateCount

if TYPE_CHECKING:
    from ..stores.redis import RedisStore

__all__ = [
    "KeyIsLocked",
    "KeyRow",
    "Stats",
    "evict_key",
    "list_keys",
    "list_keys_page",
    "show_key",
    "stats",
]

MAX_LIMIT = 10_000
"""The most rows one listing returns."""


def list_keys(
    store: Store | RedisStore,
    *,
    state: KeyState | None = None,
    scope: str | None = None,
    limit: int = 50,
) -> list[KeyRow]:
    """Up to ``limit`` keys, newest first, of one ``state`` and ``scope`` if given."""
    return list_keys_page(store, state=state, scope=scope, limit=limit)[0]


def list_keys_page(
    store: Store | RedisStore,
    *,
    state: KeyState | None = None,
    scope: str | None = None,
    limit: int = 50,
) -> tuple[list[KeyRow], bool]:
    """[`list_keys`][idempotence.maintenance.admin.list_keys], and whether more keys
    than ``limit`` match (so that a listing can say it was cut short)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    # One row past the limit tells whether there are more.
    rows = _newest(store, state, scope, limit + 1)
    return rows[:limit], len(rows) > limit


def _newest(
    store: Store | RedisStore, state: KeyState | None, scope: str | None, limit: int
) -> list[KeyRow]:
    if not isinstance(store, Store):
        rows = _redis_rows(store, store.records(scope))
        rows = [row for row in rows if state is None or row.state is state]
        return sorted(rows, key=lambda r: (r.record.created_at, r.record.id), reverse=True)[:limit]
    return store._perform(
        lambda d: _ops.list_keys(d, state=state, scope=scope, key=None, limit=limit),
        write=False,
    )


def _redis_rows(store: RedisStore, records: list[KeyRecord]) -> list[KeyRow]:
    now = store.server_time()
    return [KeyRow(record, key_state(record, now), now, 0) for record in records]


def show_key(store: Store | RedisStore, scope: str, key: str) -> KeyRow:
    """One key with its state;
    [`KeyNotFound`][idempotence.maintenance.admin.KeyNotFound] if there is none."""
    if isinstance(store, Store):
        rows = store._perform(
            lambda d: _ops.list_keys(d, state=None, scope=scope, key=key, limit=1),
            write=False,
        )
    else:
        found = store.get(scope, key)
        rows = [] if found is None else _redis_rows(store, [found])
    if not rows:
        raise KeyNotFound(f"no key {key!r} in scope {scope!r}", scope=scope, key=key)
    return rows[0]


_EVICT_ATTEMPTS = 3
"""How many incarnations of a key ``evict_key`` chases when each is replaced by a new
request while it evicts the one before."""


def evict_key(store: Store | RedisStore, scope: str, key: str, *, force: bool = False) -> KeyRow:
    """Delete one key, so that its next request runs afresh; return it as it was.

    A live lock means a worker is running the key right now: that raises
    [`KeyIsLocked`][idempotence.maintenance.admin.KeyIsLocked] unless ``force``, and
    with ``force`` the worker's later fenced writes find no row and roll back (F1).
    """
    for _ in range(_EVICT_ATTEMPTS):
        row = show_key(store, scope, key)
        if isinstance(store, Store):
            # A cache in front of the store (CachedStore) refuses the row's cached
            # response before the row goes, so no replay of it outlives it; a cache
            # that cannot be reached raises StoreUnavailable here, with nothing
            # evicted. Only that row is deleted: a newer one has no tombstone.
            row_id = row.record.id
            store._invalidate(scope, key, row_id)
            evict = functools.partial(_ops.evict, scope=scope, key=key, id=row_id, force=force)
            evicted = bool(store._perform(evict))
        else:
            evicted = bool(store.evict(scope, key, force=force))
        if evicted:
            return row
        # Refused: the row is locked now, or it is gone (KeyNotFound) or was replaced
        # by a new request's meanwhile, which is evicted in turn.
        now = show_key(store, scope, key)
        if now.record.id == row.record.id:
            break
    else:
        raise KeyIsLocked(
            f"key {key!r} in scope {scope!r} was replaced by new requests "
            f"{_EVICT_ATTEMPTS} times while it was evicted; retry",
            scope=scope,
            key=key,
        )
    locked_at = now.record.locked_at
    since = f" (locked since {locked_at:%Y-%m-%d %H:%M:%S} UTC)" if locked_at else ""
    raise KeyIsLocked(
        f"key {key!r} in scope {scope!r} is being processed{since}; pass --force to "
        "evict it anyway: the worker's writes will then be refused",
        scope=scope,
        key=key,
    )


@dataclass(frozen=True, slots=True)
class Stats:
    """Counts over the key store (or one scope's keys), on the database clock."""

    now: datetime
    states: Mapping[KeyState, int]
    """Keys per state; every state is present."""
    oldest: Mapping[KeyState, datetime]
    """The creation time of the oldest key of each state that has keys."""
    takeovers: int
    """Lock takeovers and sweeps: every one bumps a key's lock_token from 1."""
    jobs: Mapping[str, int]
    """Staged jobs not yet delivered, and the built-in runner's jobs by status."""

    @property
    def total(self) -> int:
        return sum(self.states.values())

    @property
    def oldest_pending_age(self) -> timedelta | None:
        """How long the oldest pending key has waited, or None if none is pending."""
        oldest = self.oldest.get(KeyState.PENDING)
        return None if oldest is None else self.now - oldest


def stats(store: Store | RedisStore, *, scope: str | None = None) -> Stats:
    """Count keys per state, find the oldest of each, and sum the takeovers; of one
    ``scope`` if given (a consumer's keys are in its scope, by default its name). The
    staged jobs are counted across scopes (a Redis store has none: they count 0)."""
    if isinstance(store, Store):
        clock, counts = store._perform(lambda d: _ops.key_stats(d, scope), write=False)
        now = clock.at
        jobs = store._perform(lambda d: _ops.job_stats(d), write=False)
    else:
        rows = _redis_rows(store, store.records(scope))
        now = rows[0].now if rows else store.server_time()
        counts = _counts(rows)
        jobs = {}
    states = {state: 0 for state in KeyState}
    states.update({c.state: c.keys for c in counts})
    return Stats(
        now=now,
        states=states,
        oldest={c.state: c.oldest for c in counts},
        takeovers=sum(c.takeovers for c in counts),
        jobs={status: jobs.get(status, 0) for status in ("staged", "ready", "done", "dead")},
    )


def _counts(rows: list[KeyRow]) -> list[StateCount]:
    by_state: dict[KeyState, list[KeyRow]] = {}
    for row in rows:
        by_state.setdefault(row.state, []).append(row)
    return [
        StateCount(
            state=state,
            keys=len(found),
            oldest=min(row.record.created_at for row in found),
            takeovers=sum(row.record.lock_token - 1 for row in found),
        )
        for state, found in by_state.items()
    ]
