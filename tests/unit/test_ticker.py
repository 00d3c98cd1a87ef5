"""The one ticker thread of every ``Periodic``, and the one timer of each event loop for
every ``AsyncPeriodic`` (F2's heartbeats): woken only when a new tick is due before
every other, never late for one because of that, and left nothing to wake for by the
blocks that end before their first tick."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

from idempotence._concurrency import AsyncPeriodic, Periodic
from idempotence._periodic import _TICKER, IDLE, _loop_ticker


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


def test_an_ended_block_leaves_nothing_behind_to_wake_for() -> None:
    """Most blocks (a guarded call) end long before their first tick: each must cost a
    dict entry added and removed, not an entry the ticker wakes for later (which was a
    wake of the ticker thread per call, seconds after it)."""
    ticks: list[int] = []
    for _ in range(1000):
        with Periodic("test", 0.05, lambda: bool(ticks.append(1))):
            pass
    assert not _TICKER._due
    time.sleep(0.2)
    assert ticks == []


def test_the_ticker_sleeps_for_good_once_no_block_runs() -> None:
    with Periodic("test", 30.0, lambda: True):
        pass
    deadline = time.monotonic() + 5 * IDLE
    while _TICKER._wake_at != math.inf and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _TICKER._wake_at == math.inf


def test_the_end_of_a_block_waits_for_its_tick_in_flight() -> None:
    started, ended = threading.Event(), threading.Event()

    def slow() -> bool:
        started.set()
        time.sleep(0.2)
        ended.set()
        return True

    with Periodic("test", 0.01, slow):
        assert started.wait(5)
    assert ended.is_set()


def test_a_tick_may_stop_its_own_block() -> None:
    ticks: list[int] = []
    periodic: Periodic

    def once() -> bool:
        ticks.append(1)
        periodic.stop()  # on the ticker's thread: must not wait for itself
        return True

    with Periodic("test", 0.02, once) as periodic:
        time.sleep(0.2)
    assert ticks == [1]


def test_the_blocks_of_an_event_loop_share_one_timer() -> None:
    async def main() -> tuple[int, int, int]:
        ticks: list[int] = []

        async def tick() -> bool:
            ticks.append(1)
            return True

        async with AsyncPeriodic("test", 0.05, tick):
            await asyncio.sleep(0.33)
        loop: Any = asyncio.get_running_loop()
        timers = len(loop._scheduled)
        for _ in range(1000):
            async with AsyncPeriodic("test", 3.0, tick):
                pass
        # The loop's ticker's one timer, not a (cancelled) timer left per block.
        return len(ticks), len(loop._scheduled) - timers, len(_loop_ticker()._due)

    ticks, added_timers, due = asyncio.run(main())
    assert 4 <= ticks <= 7
    assert added_timers <= 1
    assert due == 0


def test_the_end_of_an_async_block_waits_for_its_tick_in_flight() -> None:
    async def main() -> bool:
        started, ended = asyncio.Event(), asyncio.Event()

        async def slow() -> bool:
            started.set()
            await asyncio.sleep(0.1)
            ended.set()
            return True

        async with AsyncPeriodic("test", 0.01, slow):
            await started.wait()
        return ended.is_set()

    assert asyncio.run(main())


def test_a_block_begun_by_start_and_ended_by_halt_ticks_with_its_arguments() -> None:
    # The drivers' form of a block (no async with): halt() says whether a tick is in
    # flight, and stop() then waits for it; none ticks after.
    async def main() -> tuple[list[str], bool, bool, bool, int]:
        started, ended = asyncio.Event(), asyncio.Event()
        seen: list[str] = []

        async def slow(word: str) -> bool:
            seen.append(word)
            started.set()
            await asyncio.sleep(0.1)
            ended.set()
            return True

        beating = AsyncPeriodic("test", 0.01, slow, "beat").start()
        await started.wait()
        in_flight = beating.halt()
        if in_flight:
            await beating.stop()
        idle = AsyncPeriodic("test", 30.0, slow, "never").start()
        idle_in_flight = idle.halt()
        return seen, in_flight, ended.is_set(), idle_in_flight, len(_loop_ticker()._due)

    seen, in_flight, ended, idle_in_flight, due = asyncio.run(main())
    assert seen == ["beat"]
    assert in_flight and ended
    assert not idle_in_flight
    assert due == 0


def test_a_sync_block_ended_by_halt_stops_ticking() -> None:
    ticks: list[int] = []
    periodic = Periodic("test", 0.02, lambda n: bool(ticks.append(n)) or True, 7).start()
    time.sleep(0.15)
    assert periodic.halt() is False  # the sync block waits for its tick itself
    count = len(ticks)
    time.sleep(0.1)
    assert ticks and set(ticks) == {7}
    assert len(ticks) == count
