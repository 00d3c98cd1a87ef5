"""F6: the application handler as the engine's third step kind, run by the one driver
on a real store with no HTTP around it: claim, run the handler, settle the key by the
response's status (R5); the same step as the body of request-as-transaction (F3); the
engine's one wait for a twin (P10); the heartbeat of a running handler (F2)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from idempotence import AsyncSqliteStore, ConfigurationError, SqliteStore, StoredResponse
from idempotence.flows import STORED_SERVER_ERROR, Captured, Flow, ResultKind
from idempotence.flows._driver import drive
from idempotence.flows._driver_async import drive_async
from idempotence.states import Outcome
from tests.flows.support import request


class App:
    """An application handler for the engine (what an HTTP exchange is to it)."""

    def __init__(self, status: int = 201, *, fail: Exception | None = None) -> None:
        self.status = status
        self.fail = fail
        self.calls: list[Any] = []

    def run_app(self, run: Any, tx: Any, overflow: Any) -> Captured:
        self.calls.append(tx)
        if tx is not None:
            tx.execute("INSERT INTO handler_notes (note) VALUES (:note)", {"note": "wrote"})
        if self.fail is not None:
            raise self.fail
        return Captured(self.status, (("content-type", "text/plain"), ("x-seen", "1")), b"ok")


@pytest.fixture
def store(sqlite_path: str) -> Any:
    with SqliteStore(sqlite_path) as store:
        store.migrate()
        with store.transaction() as tx:
            tx.execute("CREATE TABLE IF NOT EXISTS handler_notes (note TEXT)")
        yield store


def handler_flow(*, transaction: bool = False, store_server_errors: bool = False) -> Flow:
    flow = Flow(
        "handler-step", store_server_errors=store_server_errors, request_as_transaction=transaction
    )
    flow.handler(limit=1024, rejected_statuses=frozenset({422}))
    return flow


def run(store: Any, flow: Flow, app: App, key: str = "k", **kwargs: Any) -> Any:
    return drive(flow.engine(request(flow, "s", key), app=app, **kwargs), store)


def notes(store: Any) -> int:
    with store.transaction() as tx:
        return len(list(tx.execute("SELECT note FROM handler_notes")))


@pytest.mark.parametrize("transaction", [False, True], ids=["handler", "transaction"])
def test_f6_r5_a_terminal_answer_is_stored_and_replayed(store: Any, transaction: bool) -> None:
    flow, app = handler_flow(transaction=transaction), App(201)
    first = run(store, flow, app)
    assert (first.kind, first.stored, first.answered) == (ResultKind.EXECUTED, True, True)
    assert dict(first.response.headers)["x-seen"] == "1"  # the app's answer, every header
    again = run(store, flow, app)
    assert again.kind is ResultKind.REPLAYED and len(app.calls) == 1
    assert again.response.headers == (("content-type", "text/plain"),)  # stored: kept only
    assert notes(store) == (1 if transaction else 0)


@pytest.mark.parametrize("transaction", [False, True], ids=["handler", "transaction"])
@pytest.mark.parametrize(("status", "kind"), [(422, ResultKind.REJECTED), (503, ResultKind.FAILED)])
def test_f6_r5_a_rejected_or_failed_answer_stores_nothing(
    store: Any, transaction: bool, status: int, kind: ResultKind
) -> None:
    flow, app = handler_flow(transaction=transaction), App(status)
    result = run(store, flow, app)
    assert (result.kind, result.stored, result.response.status) == (kind, False, status)
    record = store.get("s", "k")
    if transaction or status == 422:
        assert record is None  # forgotten, or rolled back with the claim
    else:
        assert record is not None and record.locked_at is None and record.response is None
    assert notes(store) == 0  # a request-as-transaction's writes rolled back with it
    assert run(store, flow, App(201)).kind is ResultKind.EXECUTED  # the retry runs


@pytest.mark.parametrize("transaction", [False, True], ids=["handler", "transaction"])
def test_f6_r5_an_exception_propagates_and_leaves_the_key_free(
    store: Any, transaction: bool
) -> None:
    flow = handler_flow(transaction=transaction)
    with pytest.raises(RuntimeError, match="boom"):
        run(store, flow, App(fail=RuntimeError("boom")))
    record = store.get("s", "k")
    assert record is None if transaction else record.locked_at is None
    assert notes(store) == 0
    assert run(store, flow, App(201)).kind is ResultKind.EXECUTED


FIXED = StoredResponse(200, (), b"processed")


def fixed_flow(*, transaction: bool) -> Flow:
    flow = Flow("handler-step", request_as_transaction=transaction)
    flow.handler(limit=1024, rejected_statuses=frozenset({422}), fixed_response=FIXED)
    return flow


@pytest.mark.parametrize("transaction", [False, True], ids=["handler", "transaction"])
def test_f3_a_fixed_response_is_what_a_terminal_answer_stores(
    store: Any, transaction: bool
) -> None:
    flow, app = fixed_flow(transaction=transaction), App(201)
    first = run(store, flow, app)
    assert (first.kind, first.stored, first.response.status) == (ResultKind.EXECUTED, True, 201)
    again = run(store, flow, app)
    assert (again.kind, again.response.status) == (ResultKind.REPLAYED, 200)
    assert store.get("s", "k").response == FIXED and len(app.calls) == 1


class HeadersApp(App):
    """Answers 201 ``b"ok"`` with the given headers."""

    def __init__(self, headers: tuple[tuple[str, str], ...]) -> None:
        super().__init__(201)
        self.headers = headers

    def run_app(self, run: Any, tx: Any, overflow: Any) -> Captured:
        self.calls.append(tx)
        return Captured(self.status, self.headers, b"ok")


@pytest.mark.parametrize(
    ("headers", "fixed", "kept"),
    [
        ((("content-type", "text/plain"),), None, (("content-type", "text/plain"),)),
        ((("Content-Type", "text/plain"),), None, (("content-type", "text/plain"),)),
        ((), FIXED, ()),
    ],
    ids=["all-kept", "renamed", "fixed"],
)
def test_f6_the_answer_sent_is_the_apps_own_whatever_is_stored(
    store: Any, headers: Any, fixed: StoredResponse | None, kept: Any
) -> None:
    """The stored response stands for the answer only when it is the app's own, every
    header as sent: a header stored lower-cased, or a fixed response, is not sent."""
    flow = Flow("handler-step")
    flow.handler(limit=1024, stored_headers=frozenset({"content-type"}), fixed_response=fixed)
    first = run(store, flow, HeadersApp(headers))
    assert first.kind is ResultKind.EXECUTED
    assert first.response == StoredResponse(201, headers, b"ok")
    assert store.get("s", "k").response == (fixed or StoredResponse(201, kept, b"ok"))


@pytest.mark.parametrize("status", [422, 503])
def test_f3_r5_a_fixed_response_written_by_the_claim_rolls_back_with_a_refused_answer(
    store: Any, status: int
) -> None:
    # The claim wrote the key finished already: the answer that stores nothing must
    # take it back with the handler's writes, or the request would be replayed as done.
    flow = fixed_flow(transaction=True)
    result = run(store, flow, App(status))
    assert (result.stored, result.response.status) == (False, status)
    assert store.get("s", "k") is None and notes(store) == 0
    assert run(store, flow, App(201)).kind is ResultKind.EXECUTED


def test_a_fixed_response_refuses_stored_server_errors() -> None:
    with pytest.raises(ConfigurationError, match="fixed_response"):
        Flow("f", store_server_errors=True).handler(limit=1, fixed_response=FIXED)


def test_f6_r5_store_server_errors_stores_an_exception_neutral(store: Any) -> None:
    flow = handler_flow(store_server_errors=True)
    with pytest.raises(RuntimeError):
        run(store, flow, App(fail=RuntimeError("boom")))
    replay = run(store, flow, App(201))
    assert (replay.kind, replay.response) == (ResultKind.REPLAYED, STORED_SERVER_ERROR)


def test_f6_the_handler_step_is_a_flows_only_step() -> None:
    flow = handler_flow()
    with pytest.raises(ConfigurationError, match="only step"):
        flow.phase("later")(lambda ctx: None)


def test_p10_the_engine_waits_for_the_twin_then_replays(store: Any) -> None:
    flow = handler_flow()
    held = store.claim(request(flow, "s", "twin"))
    assert held.outcome is Outcome.EXECUTE
    assert run(store, flow, App(201), key="twin").kind is ResultKind.IN_PROGRESS  # no wait
    twin = App(201)
    timer = threading.Timer(0.2, store.finish, (held.lease, Captured(200, (), b"t").response()))
    timer.start()
    try:
        result = run(store, flow, twin, key="twin", wait=timedelta(seconds=5))
    finally:
        timer.join()
    assert result.kind is ResultKind.REPLAYED and result.response.body == b"t"
    assert twin.calls == []


# -- F2: the driver beats for a running handler -------------------------------------------


def beating_flow(lock: float, heartbeat: float | None = None) -> Flow:
    flow = Flow("beating", lock_timeout=timedelta(seconds=lock))
    every = None if heartbeat is None else timedelta(seconds=heartbeat)
    flow.handler(limit=1024, heartbeat=every)
    return flow


def test_f2_a_handler_slower_than_its_lock_timeout_keeps_its_key_and_the_beats_stop(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    flow, twins = beating_flow(0.3), []

    class Slow:
        def run_app(self, run: Any, tx: Any, overflow: Any) -> Captured:
            time.sleep(0.9)  # three lock timeouts: only the beats keep the key
            twins.append(store.claim(request(flow, "s", "k")).outcome)
            return Captured(201, (), b"slow")

    with caplog.at_level(logging.WARNING, "idempotence"):
        result = run(store, flow, Slow())
        time.sleep(0.3)  # a beat that outlived the handler would hit a finished key
    assert twins == [Outcome.IN_PROGRESS]  # P4, never P5: the live handler was not taken over
    assert (result.kind, result.stored) == (ResultKind.EXECUTED, True)
    # Stopped, and waited for, when the handler returned: a later beat would have been
    # refused by the finished key and logged.
    assert not caplog.records


def test_f2_an_async_handler_keeps_its_key_and_its_beating_task_ends_with_it(
    sqlite_path: str,
) -> None:
    flow = beating_flow(0.3)

    async def main() -> tuple[Any, list[Outcome], int]:
        async with AsyncSqliteStore(sqlite_path) as store:
            await store.migrate()
            twins: list[Outcome] = []

            class Slow:
                async def run_app(self, run: Any, tx: Any, overflow: Any) -> Captured:
                    await asyncio.sleep(0.9)
                    twins.append((await store.claim(request(flow, "s", "k"))).outcome)
                    return Captured(201, (), b"slow")

            result = await drive_async(flow.engine(request(flow, "s", "k"), app=Slow()), store)
            return result, twins, len(asyncio.all_tasks())

    result, twins, tasks = asyncio.run(main())
    assert twins == [Outcome.IN_PROGRESS]
    assert result.kind is ResultKind.EXECUTED
    assert tasks == 1  # main itself: the beating task was awaited


def test_f2_a_refused_beat_is_logged_stops_the_beats_and_the_stalled_answer_is_not_sent(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Beats too rare for the lock: the handler stalls past it and a retry takes over.
    flow = beating_flow(0.2, heartbeat=0.5)

    class Stalled:
        def run_app(self, run: Any, tx: Any, overflow: Any) -> Captured:
            time.sleep(0.3)
            takeover = store.claim(request(flow, "s", "k"))
            assert takeover.outcome is Outcome.EXECUTE  # P5: token 2
            store.finish(takeover.lease, StoredResponse.of(201, body="theirs"))
            time.sleep(1.2)  # the beat at 0.5 s is refused, and none follows at 1.0 s
            return Captured(201, (), b"mine")

    with caplog.at_level(logging.WARNING, "idempotence"):
        stalled = run(store, flow, Stalled())  # does not raise
    # The stalled answer is neither stored nor sent: the run is LOST (the caller
    # answers "taken over"), and a retry gets the answer the key holds.
    assert (stalled.kind, stalled.response) == (ResultKind.LOST, None)
    refused = [r for r in caplog.records if "stopped beating" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.WARNING
    assert any("taken over while the handler ran" in r.getMessage() for r in caplog.records)
    replay = run(store, flow, App())
    assert (replay.kind, replay.response.body) == (ResultKind.REPLAYED, b"theirs")


def test_f2_a_heartbeat_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="heartbeat"):
        Flow("f").handler(limit=1, heartbeat=timedelta(0))


def test_f2_a_failed_beat_is_logged_and_the_next_one_keeps_the_key(
    sqlite_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    flow, twins = beating_flow(2.0, heartbeat=0.3), []
    with SqliteStore(sqlite_path, busy_timeout=0.05) as store:
        store.migrate()

        class Blocked:
            def run_app(self, run: Any, tx: Any, overflow: Any) -> Captured:
                # Another process holds SQLite's write lock across a beat: it fails.
                other = sqlite3.connect(sqlite_path, isolation_level=None)
                other.execute("BEGIN IMMEDIATE")
                time.sleep(1.0)  # longer than the store's own retries of a busy write
                other.execute("ROLLBACK")
                other.close()
                time.sleep(2.0)  # past the lock timeout: the beats went on
                twins.append(store.claim(request(flow, "s", "k")).outcome)
                return Captured(201, (), b"ok")

        with caplog.at_level(logging.WARNING, "idempotence"):
            result = run(store, flow, Blocked())
    assert result.kind is ResultKind.EXECUTED and twins == [Outcome.IN_PROGRESS]
    assert any("heartbeat failed" in r.getMessage() for r in caplog.records)
