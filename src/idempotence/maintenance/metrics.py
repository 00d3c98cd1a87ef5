"""Prometheus metrics for the background services (F5), when prometheus_client is
installed (``pip install 'idempotence[metrics]'``); without it every method is a
no-op, so the services never need to ask.

>>> from idempotence.maintenance.metrics import default_metrics
>>> default_metrics().keys_swept(3)          # counts, or does nothing
>>> from prometheus_client import start_http_server   # doctest: +SKIP
>>> start_http_server(9464)                           # doctest: +SKIP

The counters, all prefixed ``idempotence_``:

* ``keys_swept_total``: expired locks released by the sweeper: crash signals (B1);
* ``keys_completed_total{outcome}``: keys the completer resumed, by how it ended (B2);
* ``keys_expired_total`` / ``keys_reaped_total``: pending keys given a stored 408,
  finished keys deleted (B3);
* ``jobs_delivered_total`` / ``jobs_executed_total{outcome}``: staged jobs moved to the
  runner, and the runner's attempts (B4);
* ``fence_rejections_total``: writes refused because another worker took the key over
  (F1), as seen in flow results (:meth:`Metrics.flow_result`);
* ``maintenance_passes_total{service}``, ``maintenance_pass_failures_total{service}``
  and the ``maintenance_pass_seconds{service}`` histogram.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..flows import FlowResult

prometheus_client: Any
try:
    import prometheus_client
except ImportError:  # pragma: no cover - exercised only without the extra
    prometheus_client = None

#: True when prometheus_client is installed and metrics are recorded.
AVAILABLE = prometheus_client is not None


class Metrics:
    """The library's counters on one Prometheus registry (the default one unless
    given). Use :func:`default_metrics` rather than building a second set on the same
    registry, which Prometheus refuses."""

    def __init__(self, registry: Any = None) -> None:
        self._on = prometheus_client is not None
        if prometheus_client is None:
            return
        kw: dict[str, Any] = {"registry": registry} if registry is not None else {}
        counter, histogram = prometheus_client.Counter, prometheus_client.Histogram
        self._swept = counter(
            "idempotence_keys_swept", "Expired locks released (crash signals)", **kw
        )
        self._completed = counter(
            "idempotence_keys_completed", "Keys resumed by the completer", ["outcome"], **kw
        )
        self._expired = counter(
            "idempotence_keys_expired", "Pending keys past expiry given a stored 408", **kw
        )
        self._reaped = counter("idempotence_keys_reaped", "Expired finished keys deleted", **kw)
        self._delivered = counter(
            "idempotence_jobs_delivered", "Staged jobs delivered to the job runner", **kw
        )
        self._executed = counter(
            "idempotence_jobs_executed", "Job attempts by outcome", ["outcome"], **kw
        )
        self._fenced = counter(
            "idempotence_fence_rejections", "Writes refused by the fencing token", **kw
        )
        self._passes = counter(
            "idempotence_maintenance_passes", "Maintenance passes run", ["service"], **kw
        )
        self._failures = counter(
            "idempotence_maintenance_pass_failures", "Passes that failed", ["service"], **kw
        )
        self._seconds = histogram(
            "idempotence_maintenance_pass_seconds", "Pass duration", ["service"], **kw
        )

    @property
    def enabled(self) -> bool:
        return self._on

    def keys_swept(self, n: int) -> None:
        if self._on and n:
            self._swept.inc(n)

    def keys_completed(self, outcome: str, n: int = 1) -> None:
        if self._on and n:
            self._completed.labels(outcome=outcome).inc(n)

    def keys_expired(self, n: int) -> None:
        if self._on and n:
            self._expired.inc(n)

    def keys_reaped(self, n: int) -> None:
        if self._on and n:
            self._reaped.inc(n)

    def jobs_delivered(self, n: int) -> None:
        if self._on and n:
            self._delivered.inc(n)

    def jobs_executed(self, outcome: str, n: int = 1) -> None:
        if self._on and n:
            self._executed.labels(outcome=outcome).inc(n)

    def fence_rejected(self, n: int = 1) -> None:
        if self._on and n:
            self._fenced.inc(n)

    def flow_result(self, result: FlowResult) -> None:
        """Count what a flow run says about fencing: a LOST run had its write refused
        (F1). An application can call this with every result it gets."""
        if result.kind.value == "lost":
            self.fence_rejected()

    def pass_finished(self, service: str, seconds: float) -> None:
        if self._on:
            self._passes.labels(service=service).inc()
            self._seconds.labels(service=service).observe(seconds)

    def pass_failed(self, service: str) -> None:
        if self._on:
            self._failures.labels(service=service).inc()


_lock = threading.Lock()


@functools.cache
def _on_registry(registry: Any) -> Metrics:
    return Metrics(registry)


def default_metrics(registry: Any = None) -> Metrics:
    """The one :class:`Metrics` of ``registry`` (the default registry if None)."""
    # The lock makes "build once" hold across threads: a second Metrics on the same
    # registry would raise a duplicate-timeseries error.
    with _lock:
        return _on_registry(registry)
