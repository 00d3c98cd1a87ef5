"""P10: who in this process waits for which key, and the notification that wakes them.

A duplicate request in wait mode (``Policy(wait=...)``) waits for the request that
holds its key. On PostgreSQL the statement that settles the key (finish, release,
forget, the sweeper's unlock) sends a NOTIFY when someone marked the key as waited for
(``mark_waiter`` in ``sql/postgres/queries.sql``); its payload is the JSON array
``[scope, key]``. The store's one listener connection (`_listener`) receives it
and hands it to `Waiters.notify`, which wakes every waiter of that key.

No I/O here: the sync listener (a thread, waiters are ``threading.Event``) and the
async one (a task, waiters are futures) share this bookkeeping and differ only in how
they read the connection and how a waiter is woken.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

W = TypeVar("W")

MAX_PAYLOAD_BYTES = 7000
"""PostgreSQL refuses a NOTIFY payload of 8000 bytes or more (the settling statements
then send none). A waiter whose payload comes near it does not ask for one and just
sleeps its pause: the margin covers any difference between this encoding and
PostgreSQL's ``json_build_array(scope, key)::text``."""


def payload(scope: str, key: str) -> str:
    """The NOTIFY payload for a key, as PostgreSQL builds it.

    ```python
    payload("acct_1", "k1")
    # '["acct_1", "k1"]'
    ```
    """
    return json.dumps([scope, key], ensure_ascii=False)


def parse(text: str) -> tuple[str, str] | None:
    """The ``(scope, key)`` of a payload; None for anything else on the channel.

    ```python
    parse('["acct_1", "k1"]')
    # ('acct_1', 'k1')
    ```
    """
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], str)
    ):
        return value[0], value[1]
    return None


def notifiable(scope: str, key: str) -> bool:
    """Whether a NOTIFY can name this key (the scope is not too long for a payload)."""
    return len(payload(scope, key).encode()) < MAX_PAYLOAD_BYTES


class Waiters(Generic[W]):
    """The waiters of one store, by key; ``wake(waiter)`` is called once per waiter
    when its key's notification arrives.

    Thread-safe: waiters come and go on request threads while the listener delivers.

    ```python
    woken = []
    waiters = Waiters(woken.append)
    waiters.add("acct_1", "k1", "w1")
    waiters.notify('["acct_1", "k1"]')
    # 1
    woken
    # ['w1']
    ```
    """

    def __init__(self, wake: Callable[[W], None]) -> None:
        self._wake = wake
        self._by_key: dict[tuple[str, str], list[W]] = {}
        self._lock = threading.Lock()

    def add(self, scope: str, key: str, waiter: W) -> None:
        with self._lock:
            self._by_key.setdefault((scope, key), []).append(waiter)

    def discard(self, scope: str, key: str, waiter: W) -> None:
        """Forget ``waiter`` (a no-op once it was woken)."""
        with self._lock:
            waiting = self._by_key.get((scope, key))
            if waiting is None:
                return
            if waiter in waiting:
                waiting.remove(waiter)
            if not waiting:
                del self._by_key[scope, key]

    def notify(self, text: str) -> int:
        """Wake every waiter of the key that the payload ``text`` names; how many."""
        named = parse(text)
        if named is None:
            return 0
        with self._lock:
            woken = self._by_key.pop(named, [])
        # Outside the lock: waking may run arbitrary code (a loop's call_soon_threadsafe).
        for waiter in woken:
            self._wake(waiter)
        return len(woken)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(waiting) for waiting in self._by_key.values())
