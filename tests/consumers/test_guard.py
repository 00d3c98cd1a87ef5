"""The consumer guard without a broker: each decision of DESIGN 9 on real stores
(PostgreSQL and SQLite), handler mode on a bare key store, retention, the operator's
view and the metrics by consumer."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from idempotence import SqliteStore
from idempotence.consumers import (
    CONSUMER_RETENTION,
    Action,
    Consumer,
    Message,
    MessageContext,
    process,
    process_async,
)
from idempotence.errors import ConfigurationError
from idempotence.flows import Finish, Flow
from idempotence.maintenance import admin
from idempotence.maintenance.reaper import Reaper
from idempotence.metrics import Metrics, PrometheusInstrumentation
from idempotence.states import KeyState, StoredResponse
from idempotence.stores.postgres import PostgresStore
from tests.consumers.running import async_store, sync_store
from tests.support.clock import Rows

TIMES = ("created_at", "last_run_at", "finished_at", "expires_at")


def _insert(url: str) -> str:
    mark = "%s" if url.startswith("postgres") else "?"
    return f"INSERT INTO effects (message_id, pid) VALUES ({mark}, 0)"


def _count(url: str) -> int:
    with sync_store(url) as store, store.transaction() as tx:
        return int(dict(tx.execute("SELECT count(*) AS n FROM effects")[0])["n"])


def test_m1_transactional_duplicate_commits_nothing_and_is_acked(consumer_store_url: str) -> None:
    url = consumer_store_url
    insert = _insert(url)
    consumer = Consumer(
        name="orders", handler=lambda ctx: ctx.tx.execute(insert, (ctx.key,)), transactional=True
    )
    with sync_store(url) as store:
        first = process(consumer, store, Message(b"{}", message_id="m-1"))
        again = process(consumer, store, Message(b"{}", message_id="m-1", redelivered=True))
        record = store.get("orders", "m-1")
    assert (first.action, first.outcome) == (Action.ACK, "processed")
    assert (again.action, again.outcome) == (Action.ACK, "duplicate")
    assert _count(url) == 1
    assert record is not None and record.finished and record.flow == "consumer"


def test_m1_f3_a_transactional_message_writes_its_key_finished_with_its_claim(
    consumer_store_url: str,
) -> None:
    # The processed mark is known before the handler runs, so the claim writes it: the
    # handler's transaction already holds the finished key, and the COMMIT carries no
    # finish (one write of the key row instead of an insert and an update).
    url = consumer_store_url
    mark = "%s" if url.startswith("postgres") else "?"
    seen: list[Any] = []

    def handle(ctx: MessageContext) -> None:
        ctx.tx.execute(_insert(url), (ctx.key,))
        rows = ctx.tx.execute(
            "SELECT recovery_point, response_status, locked_at FROM idempotency_keys"
            f" WHERE scope = 'orders' AND key = {mark}",
            (ctx.key,),
        )
        seen.extend(tuple(dict(row).values()) for row in rows)

    consumer = Consumer(name="orders", handler=handle, transactional=True)
    with sync_store(url) as store:
        done = process(consumer, store, Message(b"{}", message_id="m-1"))
        again = process(consumer, store, Message(b"{}", message_id="m-1", redelivered=True))
        record = store.get("orders", "m-1")
    assert seen == [("finished", 200, None)]
    assert (done.outcome, again.outcome) == ("processed", "duplicate")
    assert record is not None and record.response == StoredResponse(200, (), b"")
    assert _count(url) == 1


def test_a_failed_transactional_handler_rolls_back_its_writes(consumer_store_url: str) -> None:
    url = consumer_store_url
    insert = _insert(url)

    def handle(ctx: MessageContext) -> None:
        ctx.tx.execute(insert, (ctx.key,))
        raise RuntimeError("after the write")

    consumer = Consumer(name="orders", handler=handle, transactional=True, max_attempts=2)
    with sync_store(url) as store:
        first = process(consumer, store, Message(b"{}", message_id="m-1"))
        assert store.get("orders", "m-1") is None  # the claim rolled back with the write
        last = process(consumer, store, Message(b"{}", message_id="m-1", attempt=2))
        record = store.get("orders", "m-1")
    assert (first.action, first.outcome, first.attempt) == (Action.REQUEUE, "retry", 2)
    assert (last.action, last.outcome) == (Action.DEAD_LETTER, "dead_letter")
    assert _count(url) == 0
    assert record is not None and record.error is not None  # M3: errored, R6


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (Message(b"{}"), "it has no message id"),
        (Message(b"{}", message_id="k" * 10_000), "(10000 characters) is no valid key"),
        (Message(b"{}", message_id="caf\u00e9"), "is no valid key"),
        (Message(b"\xff{}", message_id="m-1"), "its body is not UTF-8 text"),
        (Message(b"{nope", message_id="m-1"), "its body is not JSON"),
    ],
)
def test_hostile_messages_are_dead_lettered_without_a_claim(
    consumer_sqlite_path: str, message: Message, reason: str
) -> None:
    ran: list[str] = []
    consumer = Consumer(name="h", handler=lambda ctx: ran.append(ctx.key), decode="json")
    with SqliteStore(consumer_sqlite_path) as store:
        verdict = process(consumer, store, message)
        assert admin.list_keys(store, scope="h") == []
    assert verdict.action is Action.DEAD_LETTER
    assert reason in verdict.reason
    assert not ran


class OnlyKeyStore:
    """A key store with the KeyStore operations and nothing else (as Redis offers):
    handler mode must need no more. It counts the heartbeats."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.beats = 0

    def claim(self, request: Any) -> Any:
        return self._store.claim(request)

    def finish(self, lease: Any, response: Any, *, error: str | None = None) -> None:
        self._store.finish(lease, response, error=error)

    def release(self, lease: Any) -> None:
        self._store.release(lease)

    def heartbeat(self, lease: Any) -> Any:
        self.beats += 1
        return self._store.heartbeat(lease)

    def forget(self, lease: Any) -> None:
        self._store.forget(lease)

    def get(self, scope: str, key: str) -> Any:
        return self._store.get(scope, key)

    def key_status(self, scope: str, key: str) -> Any:
        return self._store.key_status(scope, key)

    def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        self._store.wait_for_settle(scope, key, seconds)

    def close(self) -> None:
        self._store.close()


def test_m2_f2_handler_mode_on_a_bare_key_store_beats_and_requeues_its_twin(
    consumer_store_url: str,
) -> None:
    """A handler that outlives its lock timeout keeps the key by heartbeats (F2); a
    twin delivery meanwhile is requeued (M2), never run; afterwards it is a duplicate."""
    runs: list[str] = []

    def handle(ctx: MessageContext) -> None:
        runs.append(ctx.key)
        time.sleep(1.2)

    consumer = Consumer(name="slow", handler=handle, lock_timeout=timedelta(seconds=0.4))
    store = OnlyKeyStore(sync_store(consumer_store_url))
    verdicts: list[Any] = []
    first = threading.Thread(
        target=lambda: verdicts.append(process(consumer, store, Message(b"x", message_id="k")))
    )
    first.start()
    time.sleep(0.7)  # past the lock timeout: only the beats keep the key
    twin = process(consumer, store, Message(b"x", message_id="k", redelivered=True))
    first.join()
    after = process(consumer, store, Message(b"x", message_id="k"))
    store.close()
    assert (twin.action, twin.outcome) == (Action.REQUEUE, "in_progress")
    assert twin.delay > 0
    assert verdicts[0].outcome == "processed"
    assert after.outcome == "duplicate"
    assert runs == ["k"]
    assert store.beats >= 2


def test_transactional_and_flow_consumers_refuse_a_bare_key_store(
    consumer_sqlite_path: str,
) -> None:
    store = OnlyKeyStore(SqliteStore(consumer_sqlite_path))
    consumer = Consumer(name="t", handler=lambda ctx: None, transactional=True)
    with pytest.raises(ConfigurationError, match="needs a SQL store"):
        process(consumer, store, Message(b"x", message_id="k"))
    store.close()


def test_m4_a_multi_step_consumer_is_a_flow_keyed_by_the_message_id(
    consumer_store_url: str,
) -> None:
    url = consumer_store_url
    insert = _insert(url)
    flow = Flow("receipt-mail", retention=CONSUMER_RETENTION)
    seen: list[Any] = []

    @flow.phase("started")
    def record(ctx: Any) -> Finish:
        seen.append(ctx.record.params)
        ctx.tx.execute(insert, (ctx.record.key,))
        return Finish(StoredResponse.of(200))

    consumer = Consumer(name="mails", flow=flow, decode="json")
    with sync_store(url) as store:
        first = process(consumer, store, Message(b'{"ride": 7}', message_id="ride-7"))
        again = process(consumer, store, Message(b'{"ride": 7}', message_id="ride-7"))
        record_ = store.get("mails", "ride-7")
    assert (first.outcome, again.outcome) == ("processed", "duplicate")
    assert seen == [{"ride": 7}]
    assert _count(url) == 1
    assert record_ is not None and record_.flow == "receipt-mail"
    with pytest.raises(ConfigurationError, match="own retention"):
        Consumer(name="mails", flow=flow, retention=timedelta(days=1))


def test_m4_retention_per_consumer_and_reaped_like_any_key(consumer_pg_url: str) -> None:
    week = Consumer(name="weekly", handler=lambda ctx: None)
    brief = Consumer(name="brief", handler=lambda ctx: None, retention=timedelta(seconds=1))
    with PostgresStore(consumer_pg_url) as store:
        process(week, store, Message(b"x", message_id="a"))
        process(brief, store, Message(b"x", message_id="b"))
        kept = store.get("weekly", "a")
        assert kept is not None and kept.expires_at is not None and kept.finished_at is not None
        assert kept.expires_at - kept.finished_at == timedelta(days=7)
        # Two days pass for both keys (their times move back): past the brief
        # consumer's retention of a second, well inside the weekly one's.
        for scope, key in (("weekly", "a"), ("brief", "b")):
            Rows("postgres", consumer_pg_url).backdate(scope, key, timedelta(days=2), *TIMES)
        Reaper(store).run_once()
        assert store.get("brief", "b") is None
        assert store.get("weekly", "a") is not None


def test_operator_view_and_metrics_by_consumer(consumer_sqlite_path: str) -> None:
    registry = CollectorRegistry()
    instrumentation = PrometheusInstrumentation(Metrics(registry))

    def handle(ctx: MessageContext) -> None:
        if ctx.key == "bad":
            raise RuntimeError("poison")

    a = Consumer(name="a", handler=handle, max_attempts=1)
    b = Consumer(name="b", handler=lambda ctx: None)
    with SqliteStore(consumer_sqlite_path, instrumentation=instrumentation) as store:
        for key in ("1", "2", "1", "bad"):
            process(a, store, Message(b"x", message_id=key))
        process(b, store, Message(b"x", message_id="1"))
        stats_a = admin.stats(store, scope="a")
        stats_all = admin.stats(store)
        listed = admin.list_keys(store, scope="a", state=KeyState.ERRORED)

    def sample(consumer: str, outcome: str) -> float:
        labels = {"consumer": consumer, "outcome": outcome}
        return registry.get_sample_value("idempotence_messages_total", labels) or 0.0

    assert stats_a.states[KeyState.COMPLETE] == 2
    assert stats_a.states[KeyState.ERRORED] == 1
    assert stats_all.states[KeyState.COMPLETE] == 3
    assert [row.record.key for row in listed] == ["bad"]
    assert sample("a", "processed") == 2
    assert sample("a", "duplicate") == 1
    assert sample("a", "dead_letter") == 1
    assert sample("b", "processed") == 1


@pytest.mark.parametrize("mode", ["handler", "transaction", "flow"])
def test_the_store_down_requeues_and_runs_nothing(mode: str) -> None:
    ran: list[str] = []
    flow = Flow("down-flow")

    @flow.phase("started")
    def phase(ctx: Any) -> Finish:
        ran.append(ctx.record.key)
        return Finish(StoredResponse.of(200))

    if mode == "flow":
        consumer = Consumer(name="down", flow=flow)
    else:
        handler = lambda ctx: ran.append(ctx.key)  # noqa: E731
        consumer = Consumer(name="down", handler=handler, transactional=mode == "transaction")
    store = PostgresStore("postgresql://postgres@127.0.0.1:1/nowhere", connect_timeout=1)
    try:
        verdict = process(consumer, store, Message(b"x", message_id="k"))
    finally:
        store.close()
    assert (verdict.action, verdict.outcome) == (Action.REQUEUE, "unavailable")
    assert not ran


def test_async_process_runs_an_async_handler_in_the_transaction(consumer_store_url: str) -> None:
    url = consumer_store_url
    insert = _insert(url)

    async def handle(ctx: MessageContext) -> None:
        await ctx.tx.execute(insert, (ctx.key,))

    consumer = Consumer(name="async", handler=handle, transactional=True)

    async def main() -> list[str]:
        store = async_store(url)
        try:
            outcomes = []
            for _ in range(2):
                verdict = await process_async(consumer, store, Message(b"x", message_id="k"))
                outcomes.append(verdict.outcome)
            return outcomes
        finally:
            await store.close()

    assert asyncio.run(main()) == ["processed", "duplicate"]
    assert _count(url) == 1
