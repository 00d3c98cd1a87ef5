"""Group commit's bookkeeping, without I/O: which writes go into the next commit, and
who commits it.

On SQLite at its default durability every commit waits for an fsync, and the disk,
not the CPU, sets the pace. So the store's own autocommit writes (claims, finishes,
heartbeats, releases) queue here, and one writer at a time commits everything queued
while the previous commit was in flight, in one transaction: a write that arrives
while the database is idle leads a group of one and goes at once, and under load
each fsync serves many writes. The drivers (`sqlite`) do the I/O: they run each
write of a group in a savepoint of its own, commit, and only then tell each caller its
own outcome.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

W = TypeVar("W")

MAX_GROUP = 64
"""The most writes one commit takes: a bound on the savepoints of one transaction and on
how long the write lock is held at a time (the rest go in the next group)."""


class Groups(Generic[W]):
    """The queue of writes waiting for a commit, and whether one is in flight.

    Not thread-safe: a threaded driver calls it under a lock of its own, an asyncio
    driver from the event loop.
    """

    def __init__(self, limit: int = MAX_GROUP) -> None:
        if limit < 1:
            raise ValueError("a group holds at least one write")
        self._limit = limit
        self._queue: deque[W] = deque()
        self._busy = False

    def arrive(self, write: W) -> bool:
        """Queue ``write``; True when no commit is in flight, and the caller must
        commit the next group now (`take`), else the group in flight's
        committer will ([`done`][idempotence.observability.Watch.done])."""
        self._queue.append(write)
        if self._busy:
            return False
        self._busy = True
        return True

    def lead(self) -> bool:
        """True when no commit is in flight: the caller commits its own write now, as a
        group of one, without queueing it (a write that arrives while the database is
        idle leads a group of one anyway), and calls
        [`done`][idempotence.observability.Watch.done] after. False: it must
        `arrive`."""
        if self._busy:
            return False
        self._busy = True
        return True

    def take(self) -> list[W]:
        """The next group: every write queued, oldest first, up to the limit."""
        if not self._busy:
            raise RuntimeError("take() without a commit under way")
        count = min(self._limit, len(self._queue))
        return [self._queue.popleft() for _ in range(count)]

    def done(self) -> W | None:
        """The group taken last has committed (or failed): the write whose caller
        commits the next group (it is first in it), or None when nothing is queued
        and the next write to arrive goes at once."""
        if not self._busy:
            raise RuntimeError("done() without a commit under way")
        if self._queue:
            return self._queue[0]
        self._busy = False
        return None

    def __len__(self) -> int:
        """Writes queued, not yet taken."""
        return len(self._queue)
