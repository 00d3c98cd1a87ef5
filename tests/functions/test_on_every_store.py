"""``@idempotent`` on every store, sync and async (DESIGN 12): one body run per key.

Each test runs on PostgreSQL, SQLite, Redis, the cached store and SQLAlchemy, as a
``def`` on the sync store and an ``async def`` on the async one (tests/functions/
conftest.py); the transactional ones on the SQL stores.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import time
import uuid
from collections import Counter
from datetime import date, timedelta
from typing import Any

import pydantic
import pytest

from idempotence import (
    ArgumentsMismatch,
    CallInProgress,
    ResultNotStorable,
    current_call,
)
from idempotence.functions import FUNCTION_FLOW
from tests.functions.conftest import Subject


class Declined(Exception):
    """A final answer: stored and raised again on replay."""


class Flaky(Exception):
    """Not final: the key is released and a retry runs again."""


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    quantity: int


@dataclasses.dataclass(frozen=True)
class Receipt:
    order: str
    lines: list[Line]
    note: str | None = None


class Charge(pydantic.BaseModel):
    id: str
    amount: int
    lines: list[int]


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Runs:
    """Counts body runs per key, from any thread."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def ran(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1


def new_key() -> str:
    return f"k-{uuid.uuid4().hex[:12]}"


# -- replay restores the declared type ----------------------------------------------------


def test_replay_restores_json_dataclasses_pydantic_and_a_serializer_pair(
    subject: Subject,
) -> None:
    runs = Runs()

    def as_dict(order_id: str) -> dict[str, Any]:
        runs.ran("dict")
        return {"order": order_id, "amounts": [1, 2.5], "paid": True, "none": None}

    def as_dataclass(order_id: str) -> Receipt:
        runs.ran("dataclass")
        return Receipt(order_id, [Line("a", 1), Line("b", 2)])

    def as_model(order_id: str) -> Charge:
        runs.ran("model")
        return Charge(id=order_id, amount=500, lines=[1, 2])

    def as_tuple_and_enum(order_id: str) -> tuple[Colour, list[Colour]]:
        runs.ran("enum")
        return Colour.RED, [Colour.BLUE]

    def as_date(order_id: str) -> date:
        runs.ran("date")
        return date(2026, 11, 28)

    def as_none(order_id: str) -> None:
        runs.ran("none")

    serializer = (date.isoformat, date.fromisoformat)
    cases: list[tuple[Any, dict[str, Any]]] = [
        (as_dict, {}),
        (as_dataclass, {}),
        (as_model, {}),
        (as_tuple_and_enum, {}),
        (as_date, {"serializer": serializer}),
        (as_none, {}),
    ]
    for body, options in cases:
        guarded = subject.guard(body, key="order_id", **options)
        key = new_key()
        first = guarded(key)
        again = guarded(order_id=key)  # the same call spelled otherwise
        assert again == first, body.__name__
        assert type(again) is type(first), body.__name__
    assert set(runs.counts.values()) == {1}, runs.counts
    replayed = subject.guard(as_dataclass, key="order_id", name="receipts")
    key = new_key()
    replayed(key)
    receipt = replayed(key)
    assert isinstance(receipt.lines[0], Line)  # nested dataclasses restored, not dicts
    record = subject.get("receipts", key)
    assert record.flow == FUNCTION_FLOW and record.path == "receipts"


def test_a_value_that_cannot_be_stored_fails_at_the_first_call_and_never_runs_again(
    subject: Subject,
) -> None:
    runs = Runs()

    def opens(order_id: str) -> Any:
        runs.ran(order_id)
        return {"handle": object()}  # no JSON form

    guarded = subject.guard(opens, key="order_id")
    key = new_key()
    with pytest.raises(ResultNotStorable, match="cannot be stored"):
        guarded(key)
    with pytest.raises(ResultNotStorable, match="ran once with this key"):
        guarded(key)
    assert runs.counts[key] == 1


def test_a_lone_surrogate_fails_at_the_first_call_and_never_runs_again(
    subject: Subject,
) -> None:
    """A str may hold half of a UTF-16 pair ("\\ud800", from a bad decode), which UTF-8
    cannot store. It used to fail while storing, after the body ran, and release the
    key: every retry ran the body again."""
    runs = Runs()

    def reads(order_id: str) -> dict[str, str]:
        runs.ran(order_id)
        return {"name": "caf\ud800"}

    guarded = subject.guard(reads, key="order_id")
    key = new_key()
    with pytest.raises(ResultNotStorable, match="lone surrogate") as caught:
        guarded(key)
    assert "'\\ud800'" in str(caught.value)  # which character, as Python writes it
    with pytest.raises(ResultNotStorable, match="ran once with this key"):
        guarded(key)
    assert runs.counts[key] == 1


# -- racing callers, the wait, the mismatch ------------------------------------------------


def _race(guarded: Any, key: str, callers: int) -> list[Any]:
    results: list[Any] = [None] * callers

    def one(i: int) -> None:
        try:
            results[i] = guarded(key, 7)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_racing_callers_run_the_body_once_and_the_others_are_refused(subject: Subject) -> None:
    runs, gate = Runs(), threading.Event()

    def charge(order_id: str, amount: int) -> int:
        runs.ran(order_id)
        gate.wait(10)
        return amount * 2

    guarded = subject.guard(charge, key="order_id")
    key = new_key()
    first = threading.Thread(target=guarded, args=(key, 7))
    first.start()
    deadline = time.monotonic() + 10
    while runs.counts[key] == 0:
        assert time.monotonic() < deadline, "the first call never started"
        time.sleep(0.005)
    refused = _race(guarded, key, 4)
    gate.set()
    first.join(10)
    assert all(isinstance(result, CallInProgress) for result in refused), refused
    assert all(result.retry_after > 0 for result in refused)
    assert guarded(key, 7) == 14
    assert runs.counts[key] == 1


def test_racing_callers_with_wait_all_return_the_one_result(subject: Subject) -> None:
    runs = Runs()

    def charge(order_id: str, amount: int) -> dict[str, int]:
        runs.ran(order_id)
        time.sleep(0.3)
        return {"charged": amount}

    guarded = subject.guard(charge, key="order_id", wait=timedelta(seconds=20))
    key = new_key()
    results = _race(guarded, key, 6)
    assert results == [{"charged": 7}] * 6, results
    assert runs.counts[key] == 1


def test_the_same_key_with_other_arguments_is_refused_before_the_body_runs(
    subject: Subject,
) -> None:
    runs = Runs()

    def charge(order_id: str, amount: int, sent_at: float = 0.0) -> int:
        runs.ran(order_id)
        return amount

    guarded = subject.guard(charge, key="order_id", fingerprint_exclude=["sent_at"])
    key = new_key()
    assert guarded(key, 100, sent_at=1.0) == 100
    assert guarded(key, 100, sent_at=2.0) == 100  # excluded: the same call
    with pytest.raises(ArgumentsMismatch, match="different arguments"):
        guarded(key, 999)
    assert runs.counts[key] == 1


# -- exceptions: final ones stored, the others release ---------------------------------------


def test_a_final_exception_is_stored_and_raised_again_and_others_release_the_key(
    subject: Subject,
) -> None:
    runs = Runs()
    fail = {"flaky": True}

    def charge(order_id: str, card: str) -> str:
        runs.ran(order_id)
        if card == "declined":
            raise Declined("card declined", 402)
        if fail["flaky"]:
            raise Flaky("network down")
        return "ok"

    guarded = subject.guard(charge, key="order_id", final_exceptions=[Declined], name="charges")
    declined = new_key()
    for _ in range(2):
        with pytest.raises(Declined) as caught:
            guarded(declined, "declined")
        assert caught.value.args == ("card declined", 402)
    assert runs.counts[declined] == 1
    flaky = new_key()
    with pytest.raises(Flaky):
        guarded(flaky, "good")
    record = subject.get("charges", flaky)
    assert record is None or not record.finished
    fail["flaky"] = False
    assert guarded(flaky, "good") == "ok"  # released, so it ran again
    assert guarded(flaky, "good") == "ok"
    assert runs.counts[flaky] == 2


# -- heartbeats keep a slow body's lock (F2) --------------------------------------------------


def test_heartbeats_keep_a_slow_bodys_lock_past_its_timeout(subject: Subject) -> None:
    runs, started = Runs(), threading.Event()

    def slow(order_id: str) -> int:
        runs.ran(order_id)
        started.set()
        time.sleep(1.6)  # four lock timeouts
        return 1

    guarded = subject.guard(
        slow,
        key="order_id",
        lock_timeout=timedelta(seconds=0.4),
        heartbeat=timedelta(seconds=0.1),
    )
    key = new_key()
    first = threading.Thread(target=guarded, args=(key,))
    first.start()
    assert started.wait(10)
    time.sleep(1.0)  # the lock would have lapsed twice without beats
    with pytest.raises(CallInProgress):
        guarded(key)  # not taken over: a second run would count 2 below
    first.join(10)
    assert guarded(key) == 1
    assert runs.counts[key] == 1


# -- transactional=True: the body's writes commit with the result (F3) ------------------------


def test_transactional_writes_commit_with_the_key_and_roll_back_with_it(
    sql_subject: Subject,
) -> None:
    subject = sql_subject
    table = f"fn_effects_{uuid.uuid4().hex[:10]}"
    subject.run_sql(f"CREATE TABLE {table} (ref VARCHAR(100) NOT NULL)")
    fail = {"now": True}

    def place(order_id: str) -> int:
        subject.execute(
            current_call().tx, f"INSERT INTO {table} (ref) VALUES (:ref)", {"ref": order_id}
        )
        if fail["now"]:
            raise Flaky("after the write")
        return 1

    guarded = subject.guard(place, key="order_id", transactional=True, name="places")
    key = new_key()
    with pytest.raises(Flaky):
        guarded(key)
    count = f"SELECT COUNT(*) AS n FROM {table} WHERE ref = :ref"
    assert _count(subject.run_sql(count, {"ref": key})) == 0  # the write rolled back...
    assert subject.get("places", key) is None  # ...with the claim
    fail["now"] = False
    assert guarded(key) == 1
    assert guarded(key) == 1
    assert _count(subject.run_sql(count, {"ref": key})) == 1
    assert subject.get("places", key).finished


def _count(rows: Any) -> int:
    row = rows[0]
    return int(row["n"] if isinstance(row, dict) else row[0])
