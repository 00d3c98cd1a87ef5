"""The one ticker thread of every ``Periodic`` (F2's heartbeats): woken only when a new
tick is due before every other, and never late for one because of that."""

from __future__ import annotations

import threading
import time

from idempotence._concurrency import Periodic


def _beats(seconds: float) -> tuple[Periodic, threading.Event]:
    fired = threading.Event()

    def tick() -> bool:
        fired.set()
        return False

    return Periodic("test", seconds, tick), fired


def test_a_tick_due_before_the_others_wakes_the_sleeping_ticker() -> None:
    slow, slow_fired = _beats(30.0)
    quick, quick_fired = _beats(0.05)
    with slow:
        time.sleep(0.2)  # let the ticker go to sleep until the slow tick, 30 s away
        started = time.monotonic()
        with quick:
            assert quick_fired.wait(5), "the ticker slept past a tick due before its own"
        assert time.monotonic() - started < 5
    assert not slow_fired.is_set()


def test_a_tick_due_after_the_head_fires_in_its_turn() -> None:
    first, first_fired = _beats(0.05)
    second, second_fired = _beats(0.1)
    with first, second:
        assert first_fired.wait(5)
        assert second_fired.wait(5)
