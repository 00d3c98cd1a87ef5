"""The history checker (idempotence.testing.history), on hand-made histories.

Each promise gets a history that keeps it and one that breaks it, so every check is
shown to fail on a bad history (DESIGN 13). No I/O: the clock is a counter the test
moves.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from idempotence.states import STARTED, KeyRecord, StoredResponse
from idempotence.testing import History, Property

NOW = datetime(2026, 1, 1, tzinfo=UTC)
OK = b'{"id": "ch_1"}'


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def store_record(status: int | None = 201, body: bytes = OK) -> KeyRecord:
    fields: dict[str, Any] = {
        "id": 1,
        "scope": "s",
        "key": "k",
        "method": "POST",
        "path": "/charges",
        "fingerprint": "f" * 64,
        "params": None,
        "flow": "http",
        "recovery_point": "finished" if status is not None else STARTED,
        "lock_token": 1,
        "locked_at": None,
        "lock_timeout": timedelta(seconds=10),
        "response": None if status is None else StoredResponse.of(status, body=body),
        "error": None,
        "created_at": NOW,
        "last_run_at": NOW,
        "finished_at": NOW if status is not None else None,
        "expires_at": None,
    }
    return KeyRecord(**fields)


def good() -> History:
    """k: one unanswered attempt (a partition), a 409 while its lock lives, then 201
    twice, and one charge."""
    history = History(clock=Clock())
    history.record("k", None, started=0.0, ended=2.0)
    history.record("k", 409, b"busy", started=2.5, ended=2.6)
    history.record("k", 201, OK, started=5.0, ended=5.1)
    history.record("k", 201, OK, started=6.0, ended=6.1)
    history.effect("k", "ch_1")
    return history


def kinds(history: History, **check: Any) -> list[Property]:
    return [v.property for v in history.check(**check).violations]


def test_a_good_history_has_no_violation() -> None:
    report = good().check(records={"k": store_record()}, healed_at=4.0, settle_within=3.0)
    assert report.ok, str(report)
    assert (report.keys, report.operations, report.acknowledged, report.unknown) == (1, 4, 1, 1)
    assert report.settle_after_heal == pytest.approx(1.1)
    report.assert_ok()
    assert "no violation" in str(report)


def test_two_effects_for_one_key_are_a_duplicate() -> None:
    history = good()
    history.effect("k", "ch_2")
    report = history.check()
    assert [v.property for v in report.violations] == [Property.DUPLICATE_EFFECT]
    assert "ch_1, ch_2" in str(report)
    with pytest.raises(AssertionError, match="duplicate effect"):
        report.assert_ok()


def test_effects_of_different_kinds_are_counted_apart() -> None:
    history = good()
    history.effect("k", "mail_1", kind="email")
    assert kinds(history) == []
    history.effect("k", "mail_2", kind="email")
    assert kinds(history) == [Property.DUPLICATE_EFFECT]


def test_a_success_without_its_effect_is_missing_one() -> None:
    history = History(clock=Clock())
    history.record("k", 201, OK, started=0, ended=1)
    assert kinds(history) == [Property.MISSING_EFFECT]
    # A stored failure (402) needs no effect.
    declined = History(clock=Clock())
    declined.record("k", 402, b"declined", started=0, ended=1)
    assert kinds(declined) == []
    # Kinds to require are the caller's choice.
    history.effect("k", "m1", kind="email")
    assert kinds(history, required_effects=("email",)) == []


def test_a_different_final_answer_is_a_replay_mismatch() -> None:
    history = good()
    history.record("k", 201, b'{"id": "ch_2"}', started=7.0, ended=7.1)
    assert kinds(history) == [Property.REPLAY_MISMATCH]
    other_status = good()
    other_status.record("k", 402, OK, started=7.0, ended=7.1)
    assert kinds(other_status) == [Property.REPLAY_MISMATCH]


def test_transient_answers_are_no_final_answer() -> None:
    history = good()
    history.record("k", 503, b"unavailable", started=7.0, ended=7.1)
    history.record("k", 500, b"boom", started=8.0, ended=8.1)
    assert kinds(history) == []
    # ...unless the caller says 500 is stored (a flow that stores 5xx, R5).
    assert kinds(history, transient={409, 503}) == [Property.REPLAY_MISMATCH]


def test_an_acknowledged_key_missing_from_the_store_is_lost() -> None:
    history = good()
    assert kinds(history, records={"k": None}) == [Property.LOST_ANSWER]
    assert kinds(history, records={"k": store_record(status=None)}) == [Property.LOST_ANSWER]
    assert kinds(history, records={"k": store_record(status=402)}) == [Property.LOST_ANSWER]
    assert kinds(history, records={"k": store_record()}) == []
    assert kinds(history, records={}) == []  # not given: not checked


def test_a_key_with_no_final_answer_is_unsettled() -> None:
    history = History(clock=Clock())
    history.record("k", None, started=0, ended=1)
    history.record("k", 503, b"", started=2, ended=3)
    assert kinds(history) == [Property.UNSETTLED]


def test_a_key_settled_too_long_after_the_heal_is_unsettled() -> None:
    history = good()  # first final answer at 5.1
    assert kinds(history, healed_at=4.0, settle_within=1.2) == []
    report = history.check(healed_at=4.0, settle_within=1.0)
    assert [v.property for v in report.violations] == [Property.UNSETTLED]
    assert "1.10 s after the heal" in str(report)
    # Settled before the heal: nothing to wait for.
    assert kinds(history, healed_at=9.0, settle_within=0.5) == []
    # A key first sent after the heal owes it nothing, however late it settles.
    later = History(clock=Clock())
    later.record("late", 201, OK, started=20.0, ended=30.0)
    later.effect("late", "ch_9")
    assert kinds(later, healed_at=4.0, settle_within=1.0) == []


def test_a_409_with_no_attempt_that_may_hold_the_lock_is_a_stale_twin() -> None:
    history = good()  # the 409 at 2.5 comes 0.5 s after an unanswered attempt
    assert kinds(history, settle_within=1.0) == []
    assert kinds(history, settle_within=0.4) == [Property.STALE_TWIN]
    # A 409 long after everything else ended: the key's own claim seen as a twin.
    history.record("k", 409, b"busy", started=30.0, ended=30.1)
    assert kinds(history, settle_within=1.0) == [Property.STALE_TWIN]


def test_a_409_during_another_attempt_is_a_true_twin() -> None:
    history = History(clock=Clock())
    history.record("k", 201, OK, started=0.0, ended=5.0)
    history.record("k", 409, b"busy", started=1.0, ended=1.1)
    history.effect("k", "ch_1")
    assert kinds(history, settle_within=0.1) == []


def test_409s_do_not_excuse_each_other() -> None:
    history = History(clock=Clock())
    history.record("k", 409, b"busy", started=0.0, ended=0.1)
    history.record("k", 409, b"busy", started=0.05, ended=0.2)
    history.record("k", 201, OK, started=0.3, ended=0.4)
    history.effect("k", "ch_1")
    assert kinds(history, settle_within=1.0) == [Property.STALE_TWIN, Property.STALE_TWIN]


def test_operation_records_the_answer_or_its_absence() -> None:
    clock = Clock()
    history = History(clock=clock)
    with history.operation("k") as op:
        clock.now = 1.0
        op.answer(201, '{"id": "ch_1"}')
    assert op.final
    with pytest.raises(TimeoutError), history.operation("k") as op:
        clock.now = 3.0
        raise TimeoutError
    assert not op.final
    first, second = history.operations
    assert (first.attempt, first.status, first.body, first.started, first.ended) == (
        1,
        201,
        OK,
        0.0,
        1.0,
    )
    assert (second.attempt, second.status, second.started, second.ended) == (2, None, 1.0, 3.0)


def test_an_attempt_cannot_end_before_it_starts() -> None:
    with pytest.raises(ValueError, match="before it starts"):
        History().record("k", 201, started=2.0, ended=1.0)


def test_recording_from_threads_and_tasks_loses_nothing() -> None:
    history = History()

    def thread_work(n: int) -> None:
        for i in range(200):
            with history.operation(f"t{n}-{i % 5}") as op:
                op.answer(201, b"ok")
            history.effect(f"t{n}-{i % 5}", f"e{i}")

    async def task_work(n: int) -> None:
        for _ in range(200):
            with history.operation(f"a{n}") as op:
                await asyncio.sleep(0)
                op.answer(201, b"ok")

    async def tasks() -> None:
        await asyncio.gather(*(task_work(n) for n in range(4)))

    threads = [threading.Thread(target=thread_work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    asyncio.run(tasks())
    for t in threads:
        t.join()
    assert len(history.operations) == 1600
    assert len(history.effects) == 800
    # Attempts are numbered per key with no gap or repeat.
    for key in {op.key for op in history.operations}:
        numbers = sorted(op.attempt for op in history.operations if op.key == key)
        assert numbers == list(range(1, len(numbers) + 1))
