"""F5: what the services tell the outside: Prometheus counters (a no-op without
prometheus_client), log records with structured fields, and per-statement timeouts."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from idempotence import StoredResponse, StoreError, open_store
from idempotence import metrics as metrics_module
from idempotence.flows import Finish, Flow, FlowRegistry, FlowResult, ResultKind
from idempotence.logs import StructuredFormatter, fields_of
from idempotence.maintenance import (
    Completer,
    CompleterConfig,
    Metrics,
    Reaper,
    ReaperConfig,
    Sweeper,
    SweeperConfig,
    default_metrics,
)
from idempotence.maintenance._service import Service
from idempotence.metrics import PrometheusInstrumentation
from tests.maintenance.support import EXPIRED, Backend, claim, new_scope, pending


@pytest.fixture
def registry() -> Any:
    """A registry of the test's own. The ``metrics`` extra is in the test extra; the
    no-op path without it is tested below by hiding the module."""
    prometheus_client = pytest.importorskip("prometheus_client")
    return prometheus_client.CollectorRegistry()


def sample(registry: Any, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)


def test_metrics_count_what_the_services_do(db: Backend, registry: Any) -> None:
    metrics = Metrics(registry)
    scope = new_scope()
    for i in range(3):
        claim(db.store, scope, f"k{i}", lock_timeout=EXPIRED)
    time.sleep(0.02)

    Sweeper(db.store, SweeperConfig(), metrics=metrics).run_once()
    Reaper(db.store, ReaperConfig(), metrics=metrics).run_once()

    assert sample(registry, "idempotence_keys_swept_total") == 3
    assert sample(registry, "idempotence_maintenance_passes_total", service="sweeper") == 1
    assert sample(registry, "idempotence_maintenance_passes_total", service="reaper") == 1
    assert sample(registry, "idempotence_maintenance_pass_seconds_count", service="reaper") == 1


def test_metrics_count_fence_rejections_from_flow_results(registry: Any) -> None:
    metrics = Metrics(registry)
    metrics.flow_result(FlowResult(ResultKind.LOST, None))
    metrics.flow_result(FlowResult(ResultKind.EXECUTED, None))
    assert sample(registry, "idempotence_fence_rejections_total") == 1


def test_metrics_count_failed_passes(pg_db: Backend, registry: Any) -> None:
    metrics = Metrics(registry)
    with psycopg.connect(pg_db.url) as blocker:
        blocker.execute("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StoreError):
            Sweeper(pg_db.store, SweeperConfig(query_timeout=0.1), metrics=metrics).run_once()
    assert sample(registry, "idempotence_maintenance_pass_failures_total", service="sweeper") == 1


def test_metrics_are_a_no_op_without_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_module, "prometheus_client", None)
    metrics = Metrics()
    assert not metrics.enabled
    metrics.keys_swept(1)
    metrics.keys_completed("completed")
    metrics.pass_finished("sweeper", 0.1)
    metrics.flow_result(FlowResult(ResultKind.LOST, None))


def test_default_metrics_are_built_once_per_registry(registry: Any) -> None:
    assert default_metrics(registry) is default_metrics(registry)
    assert default_metrics() is default_metrics()


def test_an_instrumented_store_counts_the_completers_claims_on_the_services_registry(
    db: Backend, registry: Any
) -> None:
    """The completer resumes through a flow on the store, so the store's
    instrumentation sees its claims: a resumed key is a takeover (P5). The store's
    metrics and the services' share the registry's one Metrics."""
    metrics = default_metrics(registry)
    store = open_store(db.url, instrumentation=PrometheusInstrumentation(registry=registry))
    try:
        flow, flows, scope = Flow("resumable"), FlowRegistry(), new_scope()
        flow.phase("started")(lambda ctx: Finish(StoredResponse.of(201)))
        flows.register(flow)
        pending(store, scope, "abandoned", flow="resumable")
        config = CompleterConfig(grace=timedelta(0), batch_pause=0.0)
        Completer(store, config, flows=flows, metrics=metrics).run_once()
    finally:
        store.close()

    assert sample(registry, "idempotence_keys_completed_total", outcome="completed") == 1
    assert sample(registry, "idempotence_claims_total", outcome="execute") == 2
    assert sample(registry, "idempotence_lock_takeovers_total") == 1
    assert sample(registry, "idempotence_claim_seconds_count") == 2


# -- logs ---------------------------------------------------------------------------------


def test_services_log_with_structured_fields(db: Backend, caplog: pytest.LogCaptureFixture) -> None:
    scope = new_scope()
    claim(db.store, scope, "crashed", lock_timeout=EXPIRED)
    time.sleep(0.02)
    with caplog.at_level(logging.INFO, logger="idempotence.maintenance"):
        Sweeper(db.store, SweeperConfig()).run_once()

    per_key = [r for r in caplog.records if getattr(r, "key", None) == "crashed"]
    assert len(per_key) == 1
    assert per_key[0].levelno == logging.WARNING
    assert fields_of(per_key[0]) | {"service": "sweeper", "scope": scope, "lock_token": 2} == (
        fields_of(per_key[0])
    )
    summary = caplog.records[-1]
    assert summary.getMessage() == "swept 1 expired lock(s) in 1 batch(es)"
    assert (summary.service, summary.count, summary.batches) == ("sweeper", 1, 1)  # type: ignore[attr-defined]


def test_an_idle_pass_logs_at_debug(db: Backend, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="idempotence.maintenance"):
        Sweeper(db.store, SweeperConfig()).run_once()
    # Only the service's own records: the store may log its first connection (its
    # replication, at INFO) when an earlier test left the idempotence loggers verbose.
    levels = [r.levelno for r in caplog.records if r.name.startswith("idempotence.maintenance")]
    assert levels == [logging.DEBUG]


def test_the_formatter_shows_the_fields() -> None:
    record = logging.LogRecord("idempotence.x", logging.INFO, "f", 1, "swept %d", (2,), None)
    record.service, record.count = "sweeper", 2
    text = StructuredFormatter().format(record)
    assert text.endswith("INFO idempotence.x swept 2 service='sweeper' count=2")
    data = json.loads(StructuredFormatter(as_json=True).format(record))
    assert data | {"message": "swept 2", "service": "sweeper", "count": 2} == data


# -- a timeout per statement ---------------------------------------------------------------


@pytest.mark.parametrize("service", ["sweeper", "completer", "reaper"])
def test_each_service_gives_up_a_statement_stuck_behind_a_lock(
    pg_db: Backend, service: str
) -> None:
    makers: dict[str, Callable[[], Service[Any, Any]]] = {
        "sweeper": lambda: Sweeper(pg_db.store, SweeperConfig(query_timeout=0.2)),
        "completer": lambda: Completer(
            pg_db.store,
            CompleterConfig(query_timeout=0.2, grace=timedelta(0)),
            flows=FlowRegistry(),
        ),
        "reaper": lambda: Reaper(pg_db.store, ReaperConfig(query_timeout=0.2)),
    }
    made = makers[service]()
    with psycopg.connect(pg_db.url) as blocker:
        blocker.execute("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with pytest.raises(StoreError, match="statement timeout"):
            made.run_once()
        assert time.monotonic() - started < 5
    made.run_once()  # and works again once the lock is gone
