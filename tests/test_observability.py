"""F5 on the hot path: a store given ``instrumentation=`` counts its claims by outcome,
times them, counts takeovers and refused fenced writes (Prometheus), and traces the
claim, each phase and each foreign call of the flows run on it (OpenTelemetry).

Every test runs on real databases, each store in both flavours; metrics go to a
registry of the test's own and spans to an in-memory exporter, so nothing global is
touched. The no-op paths are tested on the objects themselves, as they are without
prometheus_client or opentelemetry-api installed.
"""

from __future__ import annotations

import io
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY, CollectorRegistry

from idempotence import (
    AsyncSqliteStore,
    AsyncStore,
    ClaimRequest,
    LockLost,
    Outcome,
    SchemaMissing,
    SqliteStore,
    Store,
    StoredResponse,
)
from idempotence import metrics as metrics_module
from idempotence import tracing as tracing_module
from idempotence.flows import Advance, Finish, Flow, PhaseContext, ResultKind
from idempotence.http import Endpoint, Idempotency, IdempotencyWSGIMiddleware
from idempotence.metrics import Metrics, PrometheusInstrumentation, default_metrics
from idempotence.observability import NO_WATCH, Instrumentation, Watch, combine
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from idempotence.testing import FakeProvider
from idempotence.testing.example import create_tables, ride_request, rides_flow
from idempotence.tracing import OpenTelemetryInstrumentation
from tests.support.stores import Blocking, EventLoopThread

STORE_IDS = ["postgres-sync", "postgres-async", "sqlite-sync", "sqlite-async"]
#: A lock that expires while the test sleeps, so the next claim takes the key over.
SHORT_LOCK = timedelta(milliseconds=150)
#: Long enough to outlast SHORT_LOCK on either database clock.
PAST_SHORT_LOCK = 0.35


@dataclass
class Observed:
    """A store under test with instrumentation on, and where its reports go."""

    backend: str
    flavour: str
    #: The store's sync face (a :class:`Blocking` for an async store).
    store: Any
    #: The store itself.
    raw: Store | AsyncStore
    registry: CollectorRegistry
    exporter: InMemorySpanExporter
    loop: EventLoopThread
    #: Opens another store on the same database, without instrumentation: "another
    #: worker", whose reports must not be mixed with this one's.
    other: Callable[[], Store]

    def run(self, flow: Flow, request: ClaimRequest) -> Any:
        if isinstance(self.raw, AsyncStore):
            return self.loop.run(flow.run_async(self.raw, request))
        return flow.run(self.raw, request)

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else float(value)

    def claims(self) -> dict[str, float]:
        outcomes = [o.value for o in Outcome] + ["error"]
        found = {o: self.sample("idempotence_claims_total", outcome=o) for o in outcomes}
        return {outcome: n for outcome, n in found.items() if n}

    def spans(self) -> list[ReadableSpan]:
        return sorted(self.exporter.get_finished_spans(), key=lambda span: span.start_time or 0)


@pytest.fixture(scope="session")
def example_pg_url(pg_url: str) -> str:
    """The run's PostgreSQL database with the example flow's tables."""
    with PostgresStore(pg_url) as store:
        create_tables(store)
    return pg_url


def _tracer_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture(params=STORE_IDS)
def observed(request: pytest.FixtureRequest, loop_thread: EventLoopThread) -> Iterator[Observed]:
    backend, flavour = request.param.split("-")
    registry = CollectorRegistry()
    provider, exporter = _tracer_provider()
    instrumentation = combine(
        PrometheusInstrumentation(Metrics(registry)), OpenTelemetryInstrumentation(provider)
    )
    raw: Store | AsyncStore
    other: Callable[[], Store]
    if backend == "postgres":
        url = request.getfixturevalue("example_pg_url")
        other = lambda: PostgresStore(url)  # noqa: E731
        if flavour == "sync":
            raw = PostgresStore(url, instrumentation=instrumentation)
        else:
            raw = AsyncPostgresStore(url, instrumentation=instrumentation)
    else:
        path = request.getfixturevalue("sqlite_path")
        with SqliteStore(path) as setup:
            create_tables(setup)
        other = lambda: SqliteStore(path)  # noqa: E731
        if flavour == "sync":
            raw = SqliteStore(path, instrumentation=instrumentation)
        else:
            raw = AsyncSqliteStore(path, instrumentation=instrumentation)
    face = raw if isinstance(raw, Store) else Blocking(raw, loop_thread)
    try:
        yield Observed(backend, flavour, face, raw, registry, exporter, loop_thread, other)
    finally:
        face.close()
        provider.shutdown()


def request_for(scope: str, key: str, body: str = "a", **kw: Any) -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint=body * 64, **kw)


# -- Prometheus: the claim path ------------------------------------------------------------


def test_claims_are_counted_by_outcome_with_takeovers_and_fence_rejections(
    observed: Observed, scope: str
) -> None:
    store = observed.store
    # P1 then P3: a new key runs, its retry replays.
    first = store.claim(request_for(scope, "done"))
    store.finish(first.lease, StoredResponse.of(201, body="{}"))
    assert store.claim(request_for(scope, "done")).outcome is Outcome.REPLAY
    # P2: the same key with another request.
    assert store.claim(request_for(scope, "done", body="b")).outcome is Outcome.MISMATCH
    # P4: a twin while the first holds a live lock.
    store.claim(request_for(scope, "busy"))
    assert store.claim(request_for(scope, "busy")).outcome is Outcome.IN_PROGRESS
    # P5: the holder's lock expires and another claim takes the key over.
    stale = store.claim(request_for(scope, "crashed", lock_timeout=SHORT_LOCK)).lease
    time.sleep(PAST_SHORT_LOCK)
    fresh = store.claim(request_for(scope, "crashed", lock_timeout=SHORT_LOCK))
    assert fresh.outcome is Outcome.EXECUTE and fresh.took_over
    assert fresh.lease.token == stale.token + 1
    # F1: every fenced write of the stale worker is refused, and counted by operation.
    with pytest.raises(LockLost), store.transaction() as tx:
        store.checkpoint(tx, stale, "charged")
    with pytest.raises(LockLost):
        store.finish(stale, StoredResponse.of(201))
    with pytest.raises(LockLost):
        store.release(stale)
    with pytest.raises(LockLost):
        store.heartbeat(stale)

    assert observed.claims() == {"execute": 4, "replay": 1, "mismatch": 1, "in_progress": 1}
    assert observed.sample("idempotence_lock_takeovers_total") == 1
    for operation in ("checkpoint", "finish", "release", "heartbeat"):
        assert observed.sample("idempotence_lock_lost_total", operation=operation) == 1
    assert observed.sample("idempotence_lock_lost_total", operation="forget") == 0
    # One latency sample per claim, each a plausible duration.
    assert observed.sample("idempotence_claim_seconds_count") == 7
    total = observed.sample("idempotence_claim_seconds_sum")
    assert 0 < total < 7 * 5
    # The takeover's span says so; the stale worker's refusals are events on no span
    # (none was current), so they are only counted.
    takeovers = [
        span.attributes
        for span in observed.spans()
        if span.attributes and span.attributes.get("idempotence.takeover")
    ]
    assert takeovers == [
        {
            "idempotence.scope": scope,
            "idempotence.key": "crashed",
            "idempotence.flow": "default",
            "idempotence.outcome": "execute",
            "idempotence.recovery_point": "started",
            "idempotence.lock_token": stale.token + 1,
            "idempotence.takeover": True,
        }
    ]
    # The fresh worker still holds the key: its writes pass.
    store.finish(fresh.lease, StoredResponse.of(201))
    assert observed.sample("idempotence_lock_lost_total", operation="finish") == 1


def test_a_write_refused_after_a_claim_given_its_response_is_counted(
    observed: Observed, scope: str
) -> None:
    # Refused at the call, before any statement (F3): counted as a refused fenced write.
    store = observed.store
    finished = StoredResponse.of(200)
    with (
        pytest.raises(LockLost),
        store.transaction(claim=request_for(scope, "consumed"), finished=finished) as tx,
    ):
        store.finish(tx.claim.lease, StoredResponse.of(201), tx=tx, at_commit=True)
    assert observed.sample("idempotence_lock_lost_total", operation="finish") == 1


def test_a_claim_that_fails_is_counted_and_timed_as_an_error(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    provider, exporter = _tracer_provider()
    instrumentation = combine(
        PrometheusInstrumentation(Metrics(registry)), OpenTelemetryInstrumentation(provider)
    )
    # Not migrated: the claim raises, and the store's answer is an error, not an outcome.
    store = SqliteStore(str(tmp_path / "bare.sqlite3"), instrumentation=instrumentation)
    with store, pytest.raises(SchemaMissing):
        store.claim(request_for("s", "k"))
    assert registry.get_sample_value("idempotence_claims_total", {"outcome": "error"}) == 1
    assert registry.get_sample_value("idempotence_claim_seconds_count") == 1
    [span] = exporter.get_finished_spans()
    assert span.name == "idempotence.claim"
    assert span.status.status_code is StatusCode.ERROR
    assert [event.name for event in span.events] == ["exception"]


# -- OpenTelemetry: a flow's spans -----------------------------------------------------------


def by_name(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [span.name for span in spans]
    return named


def test_a_flow_run_is_one_span_with_its_claim_phases_and_calls_as_children(
    observed: Observed, scope: str, tmp_path: Path
) -> None:
    flow = rides_flow(FakeProvider(tmp_path / "provider.sqlite3"))
    result = observed.run(flow, ride_request(flow, scope=scope, key="ride"))
    assert result.kind is ResultKind.EXECUTED

    spans = observed.spans()
    assert [span.name for span in spans] == [
        "idempotence.flow rides",
        "idempotence.claim",
        "idempotence.phase started",
        "idempotence.call charge",
        "idempotence.phase ride_created",
        "idempotence.phase charge_created",
    ]
    root, *children = spans
    assert root.parent is None
    for child in children:
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
        assert child.status.status_code is StatusCode.UNSET
    named = by_name(spans)
    key_id = result.claim.lease.id
    assert dict(root.attributes or {}) == {
        "idempotence.flow": "rides",
        "idempotence.scope": scope,
        "idempotence.key": "ride",
        "idempotence.method": "POST",
        "idempotence.path": "/v1/rides",
        "idempotence.result": "executed",
        "idempotence.response.status": 201,
    }
    assert dict(named["idempotence.claim"].attributes or {}) == {
        "idempotence.scope": scope,
        "idempotence.key": "ride",
        "idempotence.flow": "rides",
        "idempotence.outcome": "execute",
        "idempotence.recovery_point": "started",
        "idempotence.lock_token": 1,
        "idempotence.takeover": False,
    }
    assert dict(named["idempotence.phase started"].attributes or {}) == {
        "idempotence.flow": "rides",
        "idempotence.recovery_point": "started",
        "idempotence.phase.result": "advance",
        "idempotence.next_recovery_point": "ride_created",
    }
    assert dict(named["idempotence.call charge"].attributes or {}) == {
        "idempotence.flow": "rides",
        "idempotence.call": "charge",
        "idempotence.derived_key": f"rides-{key_id}-charge",
        "idempotence.idempotent": True,
    }
    assert named["idempotence.phase charge_created"].attributes == {
        "idempotence.flow": "rides",
        "idempotence.recovery_point": "charge_created",
        "idempotence.phase.result": "finish",
        "idempotence.response.status": 201,
    }
    # The request's body and parameters are never recorded.
    values = [str(v) for span in spans for v in (span.attributes or {}).values()]
    assert not any("tok_visa" in v or "Orly" in v or "2000" in v for v in values)

    # A retry is a flow span with a replayed claim, and no phase.
    observed.exporter.clear()
    assert observed.run(flow, ride_request(flow, scope=scope, key="ride")).kind is (
        ResultKind.REPLAYED
    )
    replay = by_name(observed.spans())
    assert set(replay) == {"idempotence.flow rides", "idempotence.claim"}
    assert replay["idempotence.claim"].attributes is not None
    assert replay["idempotence.claim"].attributes["idempotence.outcome"] == "replay"
    assert replay["idempotence.flow rides"].attributes is not None
    assert replay["idempotence.flow rides"].attributes["idempotence.result"] == "replayed"
    assert observed.claims() == {"execute": 1, "replay": 1}


def test_a_refused_phase_is_an_error_span_with_a_lock_lost_event(
    observed: Observed, scope: str
) -> None:
    """F1 inside a flow: the foreign call outlasts the lock, another worker takes the
    key over, and the phase recording the call is refused at its fenced finish."""
    flow = Flow("fenced", lock_timeout=SHORT_LOCK)
    request = flow.request(scope=scope, key="slow", fingerprint="f" * 64)
    other = observed.other()

    @flow.phase("started")
    def start(ctx: PhaseContext) -> Advance:
        return Advance("calling")

    def slow_call(ctx: Any) -> str:
        time.sleep(PAST_SHORT_LOCK)
        # Another worker (not instrumented) takes the key over meanwhile.
        assert other.claim(request).outcome is Outcome.EXECUTE
        return "called"

    flow.foreign(
        "calling",
        name="slow",
        call=slow_call,
        record=lambda ctx, value: Finish(StoredResponse.of(201, body=value)),
    )
    try:
        result = observed.run(flow, request)
    finally:
        other.close()
    assert result.kind is ResultKind.LOST

    named = by_name(observed.spans())
    refused = named["idempotence.phase calling"]
    assert refused.status.status_code is StatusCode.ERROR
    lost = [event for event in refused.events if event.name == "idempotence.lock_lost"]
    assert [dict(event.attributes or {}) for event in lost] == [
        {"idempotence.operation": "finish", "idempotence.lock_token": 1}
    ]
    root = named["idempotence.flow fenced"]
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes is not None and root.attributes["idempotence.result"] == "lost"
    assert named["idempotence.call slow"].status.status_code is StatusCode.UNSET
    assert observed.sample("idempotence_lock_lost_total", operation="finish") == 1
    assert observed.claims() == {"execute": 1}


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_request_as_transaction_claim_is_a_child_of_its_phase(
    flavour: str, sqlite_path: str, loop_thread: EventLoopThread
) -> None:
    """F3: the claim runs inside the phase's transaction, so its span is the phase's
    child."""
    provider, exporter = _tracer_provider()
    instrumentation = OpenTelemetryInstrumentation(provider)
    flow = Flow("local", request_as_transaction=True)
    flow.phase("started")(lambda ctx: Finish(StoredResponse.of(201)))
    request = flow.request(scope="s", key="k", fingerprint="f" * 64)
    if flavour == "sync":
        with SqliteStore(sqlite_path, instrumentation=instrumentation) as store:
            assert flow.run(store, request).kind is ResultKind.EXECUTED
    else:
        astore = AsyncSqliteStore(sqlite_path, instrumentation=instrumentation)
        try:
            result = loop_thread.run(flow.run_async(astore, request))
            assert result.kind is ResultKind.EXECUTED
        finally:
            loop_thread.run(astore.close())

    named = by_name(list(exporter.get_finished_spans()))
    assert set(named) == {
        "idempotence.flow local",
        "idempotence.phase started",
        "idempotence.claim",
    }
    root, phase = named["idempotence.flow local"], named["idempotence.phase started"]
    claim = named["idempotence.claim"]
    assert phase.parent is not None and phase.parent.span_id == root.context.span_id
    assert claim.parent is not None and claim.parent.span_id == phase.context.span_id


# -- one place to enable it: the HTTP middleware goes through the store ---------------------


def test_the_http_middleware_reports_through_the_store(sqlite_path: str) -> None:
    registry = CollectorRegistry()
    instrumentation = PrometheusInstrumentation(Metrics(registry))

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("201 Created", [("content-type", "application/json")])
        return [b'{"id": 1}']

    with SqliteStore(sqlite_path, instrumentation=instrumentation) as store:
        config = Idempotency(store=store, scope=lambda r: "acct", endpoints=[Endpoint("/c")])
        guarded = IdempotencyWSGIMiddleware(app, config)
        for _ in range(2):
            environ = {
                "REQUEST_METHOD": "POST",
                "PATH_INFO": "/c",
                "QUERY_STRING": "",
                "SERVER_NAME": "test",
                "SERVER_PORT": "80",
                "SERVER_PROTOCOL": "HTTP/1.1",
                "CONTENT_TYPE": "application/json",
                "CONTENT_LENGTH": "2",
                "HTTP_IDEMPOTENCY_KEY": '"k1"',
                "wsgi.input": io.BytesIO(b"{}"),
                "wsgi.errors": sys.stderr,
                "wsgi.url_scheme": "http",
            }
            body = b"".join(guarded(environ, lambda status, headers, exc=None: None))
            assert json.loads(body) == {"id": 1}

    def claims(outcome: str) -> float | None:
        return registry.get_sample_value("idempotence_claims_total", {"outcome": outcome})

    assert (claims("execute"), claims("replay")) == (1, 1)


# -- disabled: nothing recorded, nothing fails -----------------------------------------------


def test_without_instrumentation_a_store_records_nothing(sqlite_path: str, tmp_path: Path) -> None:
    def recorded() -> list[float | None]:
        # The default registry: where an instrumentation made without one would count.
        return [
            REGISTRY.get_sample_value("idempotence_claims_total", {"outcome": outcome})
            for outcome in ("execute", "replay")
        ] + [REGISTRY.get_sample_value("idempotence_claim_seconds_count")]

    before = recorded()
    with SqliteStore(sqlite_path) as store:
        assert store.instrumentation is None
        create_tables(store)
        flow = rides_flow(FakeProvider(tmp_path / "provider.sqlite3"))
        for expected in (ResultKind.EXECUTED, ResultKind.REPLAYED):
            assert flow.run(store, ride_request(flow, scope="s", key="k")).kind is expected
    assert recorded() == before


def test_without_the_packages_the_instrumentations_are_dropped(
    monkeypatch: pytest.MonkeyPatch, sqlite_path: str, tmp_path: Path
) -> None:
    # As if neither prometheus_client nor opentelemetry-api were installed.
    monkeypatch.setattr(metrics_module, "prometheus_client", None)
    monkeypatch.setattr(tracing_module, "otel_trace", None)
    provider, exporter = _tracer_provider()
    prometheus = PrometheusInstrumentation(Metrics())
    otel = OpenTelemetryInstrumentation(provider)
    assert not prometheus.enabled and not otel.enabled
    assert combine(prometheus, otel) is None

    # Their hooks still work, and do nothing.
    request = request_for("s", "k")
    for instrumentation in (prometheus, otel, Instrumentation()):
        with instrumentation.claim(request) as watch:
            assert watch.done("claim") == "claim"  # type: ignore[arg-type]
        with instrumentation.run("f", request), instrumentation.phase("f", "started"):
            pass
        with instrumentation.call("f", "charge", derived_key="f-1-charge", idempotent=True):
            pass
        instrumentation.lock_lost("finish", LockLost())
    assert prometheus.claim(request) is NO_WATCH and otel.claim(request) is NO_WATCH

    # A store given them pays nothing and runs as without.
    with SqliteStore(sqlite_path, instrumentation=combine(prometheus, otel)) as store:
        assert store.instrumentation is None
        create_tables(store)
        flow = rides_flow(FakeProvider(tmp_path / "provider.sqlite3"))
        assert flow.run(store, ride_request(flow, scope="s", key="k")).kind is (ResultKind.EXECUTED)
    with SqliteStore(sqlite_path, instrumentation=prometheus) as store:
        assert store.instrumentation is None
    assert exporter.get_finished_spans() == ()


def test_combine_keeps_what_is_enabled_and_reports_to_each() -> None:
    events: list[str] = []

    class Recorder(Instrumentation):
        def __init__(self, name: str) -> None:
            self.name = name

        def claim(self, request: ClaimRequest) -> Watch[Any]:
            recorder = self

            class Noting(Watch[Any]):
                def __enter__(self) -> Watch[Any]:
                    events.append(f"{recorder.name} enter")
                    return self

                def __exit__(self, *exc: object) -> None:
                    events.append(f"{recorder.name} exit")

                def done(self, result: Any) -> Any:
                    events.append(f"{recorder.name} done {result}")
                    return result

            return Noting()

        def lock_lost(self, operation: str, error: LockLost) -> None:
            events.append(f"{self.name} lost {operation}")

    class Disabled(Instrumentation):
        @property
        def enabled(self) -> bool:
            return False

    a, b = Recorder("a"), Recorder("b")
    assert combine() is None and combine(None, Disabled()) is None
    assert combine(a, None, Disabled()) is a
    both = combine(a, b)
    assert both is not None
    with both.claim(request_for("s", "k")) as watch:
        watch.done("c")  # type: ignore[arg-type]
    both.lock_lost("release", LockLost())
    assert events == [
        "a enter",
        "b enter",
        "a done c",
        "b done c",
        "b exit",
        "a exit",
        "a lost release",
        "b lost release",
    ]


def test_the_store_and_the_services_share_one_metrics_per_registry() -> None:
    registry = CollectorRegistry()
    assert PrometheusInstrumentation(registry=registry).metrics is default_metrics(registry)
    # The old import path of the services' metrics is the same object.
    from idempotence.maintenance import metrics as old

    assert old.Metrics is Metrics and old.default_metrics is default_metrics


def test_the_old_import_path_of_the_log_formatter_works() -> None:
    from idempotence import logs
    from idempotence.maintenance import logs as old

    assert old.StructuredFormatter is logs.StructuredFormatter
    assert old.fields_of is logs.fields_of
