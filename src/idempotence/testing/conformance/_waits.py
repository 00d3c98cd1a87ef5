"""The waiting tests (P10): a duplicate held while its twin's key is in progress, for
stores with `Capability.WAITING`; woken by the database the moment the key settles,
for stores with `Capability.LISTENING` too."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from ...states import Outcome
from ...stores.capabilities import Capability
from ._support import request, requires, response

BOUND = 0.2
"""The bound of a short wait, in seconds: a polling store sleeps it out."""
LONG = 5.0
"""The bound of a wait that only a notification ends well before it."""
PROMPT = 1.5
"""How soon a wait must be back after its bound, or after the finish that wakes it:
a generous margin on a loaded machine, and still well under `LONG`."""
TWIN_WORKS = 0.3
"""How long the twin works, while the duplicate waits, before it finishes."""
HELD = timedelta(hours=1)
"""A lock that does not expire during a test."""


def _timed_wait(store: Any, scope: str, key: str, seconds: float) -> float:
    started = time.monotonic()
    store.wait_for_settle(scope, key, seconds)
    return time.monotonic() - started


@requires(Capability.WAITING)
def test_p10_a_wait_for_a_key_in_progress_ends_by_its_bound(store: Any, scope: str) -> None:
    store.claim(request(scope, lock_timeout=HELD))
    waited = _timed_wait(store, scope, "key-1", BOUND)
    assert waited < BOUND + PROMPT, f"a wait bounded by {BOUND} s took {waited:.2f} s"
    # Waiting takes nothing over: the key is still the twin's.
    claim = store.claim(request(scope))
    assert claim.outcome is Outcome.IN_PROGRESS
    assert claim.record.lock_token == 1


@requires(Capability.WAITING)
def test_p10_after_a_wait_the_claim_answers_for_the_settled_key(store: Any, scope: str) -> None:
    finished = store.claim(request(scope, lock_timeout=HELD)).lease
    released = store.claim(request(scope, key="key-2", lock_timeout=HELD)).lease
    store.finish(finished, response(7))
    store.release(released)
    # A settled key, a released one and one never claimed: each wait is bounded, and
    # the claim after it answers as the key now is.
    for key in ("key-1", "key-2", "never-claimed"):
        waited = _timed_wait(store, scope, key, BOUND)
        assert waited < BOUND + PROMPT, f"a wait bounded by {BOUND} s took {waited:.2f} s"
    assert store.claim(request(scope)).response == response(7)
    taken = store.claim(request(scope, key="key-2"))
    assert taken.outcome is Outcome.EXECUTE and taken.lease.token == released.token + 1


class _Waiting:
    """``store.wait_for_settle`` on a thread of its own, timed."""

    def __init__(self, store: Any, scope: str, key: str, seconds: float) -> None:
        self.ended: float | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._wait, args=(store, scope, key, seconds))
        self._thread.start()

    def _wait(self, store: Any, scope: str, key: str, seconds: float) -> None:
        try:
            store.wait_for_settle(scope, key, seconds)
        except BaseException as exc:
            self.error = exc
        self.ended = time.monotonic()

    @property
    def waiting(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> float:
        """When the wait ended (``time.monotonic()``)."""
        self._thread.join(LONG + PROMPT)
        assert not self._thread.is_alive(), f"a wait bounded by {LONG} s did not end"
        if self.error is not None:
            raise self.error
        assert self.ended is not None
        return self.ended


@requires(Capability.WAITING, Capability.LISTENING)
def test_p10_a_listening_store_wakes_the_waiter_as_the_key_settles(store: Any, scope: str) -> None:
    lease = store.claim(request(scope, lock_timeout=HELD)).lease
    waiting = _Waiting(store, scope, "key-1", LONG)
    time.sleep(TWIN_WORKS)  # the twin works; the duplicate waits meanwhile
    assert waiting.waiting, "the wait ended before the key settled"
    store.finish(lease, response(3))
    finished = time.monotonic()
    woke = waiting.join() - finished
    assert woke < PROMPT, (
        f"the waiter was back {woke:.2f} s after the finish, its wait bounded by {LONG} s: "
        "a store that declares Capability.LISTENING is woken as the key settles, not "
        "when its wait runs out"
    )
    assert store.claim(request(scope)).response == response(3)
