"""The schedule of a finish tried again in the background (flows/handler.py,
``LateFinish``), on a clock of the test's own: short pauses that double up to a cap,
a beat when one is due, and the end once the lock has lapsed by this process's clock,
later for each beat that landed."""

from __future__ import annotations

import pytest

from idempotence.flows import handler
from idempotence.flows.handler import FIRST_TRY, MAX_TRY_PAUSE, LateFinish


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [500.0]
    monkeypatch.setattr(handler.time, "monotonic", lambda: now[0])
    return now


def test_the_pauses_double_up_to_a_cap_and_end_when_the_lock_lapses(clock: list[float]) -> None:
    schedule = LateFinish(lock_timeout=2.0, beat_every=0.7)
    pauses = []
    while (pause := schedule.pause()) is not None:
        pauses.append(pause)
        clock[0] += pause
    assert pauses[:3] == [FIRST_TRY, FIRST_TRY * 2, FIRST_TRY * 4]
    assert max(pauses) == MAX_TRY_PAUSE
    assert clock[0] == pytest.approx(502.0)  # the lock lapsed: given up, not before


def test_a_beat_is_due_every_interval_and_one_that_landed_moves_the_end(
    clock: list[float],
) -> None:
    schedule = LateFinish(lock_timeout=2.0, beat_every=0.7)
    assert not schedule.beat_due()
    clock[0] += 0.7
    assert schedule.beat_due()  # and again until one lands (a failed beat retries)
    clock[0] += 0.1
    assert schedule.beat_due()
    schedule.beaten(sent_at=clock[0])
    assert not schedule.beat_due()
    clock[0] += 1.9  # past the first lapse (502.0): the beat keeps it 2 s from 500.8
    assert schedule.pause() is not None
    clock[0] += 0.2
    assert schedule.pause() is None
    # A beat sent before the failure (an older one) never shortens the wait.
    later = LateFinish(lock_timeout=2.0, beat_every=0.7)
    later.beaten(sent_at=clock[0] - 10)
    assert later.pause() is not None
