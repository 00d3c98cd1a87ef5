"""F6: the application handler as the engine's third step kind, run by the one driver
on a real store with no HTTP around it: claim, run the handler, settle the key by the
response's status (R5); the same step as the body of request-as-transaction (F3); the
engine's one wait for a twin (P10)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from idempotence import ConfigurationError, SqliteStore
from idempotence.flows import STORED_SERVER_ERROR, Captured, Flow, ResultKind
from idempotence.flows._driver import drive
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
