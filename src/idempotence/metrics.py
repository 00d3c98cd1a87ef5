"""Prometheus metrics (F5), when prometheus_client is installed
(``pip install 'idempotence[metrics]'``); without it every method is a no-op, so
nothing that records needs to ask.

```python
from idempotence.metrics import PrometheusInstrumentation, default_metrics
default_metrics().keys_swept(3)          # counts, or does nothing
store = PostgresStore(url, instrumentation=PrometheusInstrumentation())
from prometheus_client import start_http_server
start_http_server(9464)
```

The metrics, all prefixed ``idempotence_``. The hot path, from a store given a
[`PrometheusInstrumentation`][idempotence.metrics.PrometheusInstrumentation] (see
[`idempotence.observability`][idempotence.observability]):

* ``claims_total{outcome}``: claims by outcome, ``execute``, ``replay``,
  ``in_progress`` (a conflict), ``mismatch``, or ``error`` when the claim raised
  (DESIGN 4);
* ``claim_seconds``: the claim's latency, a histogram with one sample per claim;
* ``lock_takeovers_total``: claims that took an existing key over (P5): its lock had
  expired or been released (a crash, a sweep, a failed run), and its fencing token was
  bumped;
* ``lock_lost_total{operation}``: fenced writes the store refused because another
  worker took the key over (F1), by operation: ``checkpoint``, ``finish``,
  ``release``, ``heartbeat``, ``forget``;
* ``cache_total{event}``: what the Redis cache in front of a ``CachedStore`` did:
  ``hit`` (a replay served from Redis), ``miss`` (the primary answered), ``error``
  (Redis failed or timed out, and the primary answered alone: degraded, never a 5xx);
* ``messages_total{consumer,outcome}``: deliveries a guarded consumer settled
  ([`idempotence.consumers`][idempotence.consumers]), by outcome: ``processed``, ``duplicate`` (a
  redelivery absorbed), ``in_progress`` (requeued: its key was held elsewhere, M2),
  ``retry`` (a failed attempt, requeued), ``unavailable`` (the key store failed:
  requeued), ``dead_letter`` (M3, or a hostile message).

The background services ([`idempotence.maintenance`][idempotence.maintenance]):

* ``keys_swept_total``: expired locks released by the sweeper: crash signals (B1);
* ``keys_completed_total{outcome}``: keys the completer resumed, by how it ended (B2);
* ``keys_expired_total`` / ``keys_reaped_total``: pending keys given a stored 408,
  finished keys deleted (B3);
* ``jobs_delivered_total`` / ``jobs_executed_total{outcome}``: staged jobs moved to the
  runner, and the runner's attempts (B4);
* ``fence_rejections_total``: runs whose writes were refused because another worker took
  the key over (F1), as seen in flow results
  ([`Metrics.flow_result`][idempotence.metrics.Metrics.flow_result]);
* ``maintenance_passes_total{service}``, ``maintenance_pass_failures_total{service}``
  and the ``maintenance_pass_seconds{service}`` histogram.
"""

from __future__ import annotations

import functools
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .observability import NO_WATCH, Instrumentation, Watch
from .states import Outcome

if TYPE_CHECKING:
    from .errors import LockLost
    from .flows import FlowResult
    from .states import Claim, ClaimRequest

prometheus_client: Any
try:
    import prometheus_client
except ImportError:  # pragma: no cover - exercised only without the extra
    prometheus_client = None

AVAILABLE = prometheus_client is not None
"""True when prometheus_client is installed and metrics are recorded."""

CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""The claim histogram's buckets, in seconds: a claim is one statement, so most land
in the low milliseconds; the top buckets catch a pool or a lock waited for."""

CLAIM_ERROR = "error"
"""The outcome label of a claim that raised (the store was unreachable, say)."""

FENCED_OPERATIONS = ("checkpoint", "finish", "release", "heartbeat", "forget")
"""The operations a fence can refuse, pre-declared so that their series exist at 0."""

CACHE_EVENTS = ("hit", "miss", "error")
"""What a ``CachedStore``'s Redis did, pre-declared so that their series exist at 0."""


class Metrics:
    """The library's metrics on one Prometheus registry (the default one unless given).
    Use [`default_metrics`][idempotence.maintenance.metrics.default_metrics] rather than
    building a second set on the same registry, which Prometheus refuses."""

    def __init__(self, registry: Any = None) -> None:
        self._on = prometheus_client is not None
        if prometheus_client is None:
            return
        kw: dict[str, Any] = {"registry": registry} if registry is not None else {}
        counter, histogram = prometheus_client.Counter, prometheus_client.Histogram
        # -- the hot path: claims and fenced writes ------------------------------------
        claims = counter("idempotence_claims", "Claims by outcome", ["outcome"], **kw)
        # The children are looked up once here: labels() takes a lock on every call.
        self._claims = {
            outcome: claims.labels(outcome=outcome)
            for outcome in [o.value for o in Outcome] + [CLAIM_ERROR]
        }
        self._claim_seconds = histogram(
            "idempotence_claim_seconds", "Claim latency", buckets=CLAIM_BUCKETS, **kw
        )
        self._takeovers = counter(
            "idempotence_lock_takeovers", "Claims that took over a key whose lock had expired", **kw
        )
        lock_lost = counter(
            "idempotence_lock_lost", "Fenced writes refused, by operation", ["operation"], **kw
        )
        self._lock_lost = {op: lock_lost.labels(operation=op) for op in FENCED_OPERATIONS}
        self._lock_lost_family = lock_lost
        cache = counter(
            "idempotence_cache", "CachedStore: Redis hits, misses, errors", ["event"], **kw
        )
        self._cache = {event: cache.labels(event=event) for event in CACHE_EVENTS}
        self._messages = counter(
            "idempotence_messages",
            "Deliveries settled by guarded consumers",
            ["consumer", "outcome"],
            **kw,
        )
        # -- the background services -------------------------------------------------------
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

    # -- the hot path ---------------------------------------------------------------------

    def claimed(self, outcome: str, seconds: float, *, took_over: bool = False) -> None:
        """Count one claim: its outcome (an
        [`Outcome`][idempotence.maintenance.completer_async.Outcome] value or
        ``"error"``), its latency, and whether it took the key over (P5)."""
        if self._on:
            self._claims[outcome].inc()
            self._claim_seconds.observe(seconds)
            if took_over:
                self._takeovers.inc()

    def lock_lost(self, operation: str) -> None:
        """Count a fenced write the store refused (F1)."""
        if self._on:
            child = self._lock_lost.get(operation)
            if child is None:
                child = self._lock_lost_family.labels(operation=operation)
            child.inc()

    def cache(self, event: str) -> None:
        """Count what the Redis cache of a ``CachedStore`` did (``CACHE_EVENTS``)."""
        if self._on:
            self._cache[event].inc()

    def message(self, consumer: str, outcome: str) -> None:
        """Count one delivery a guarded consumer settled, by ``outcome``."""
        if self._on:
            self._messages.labels(consumer=consumer, outcome=outcome).inc()

    # -- the background services ----------------------------------------------------------

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
    """The one [`Metrics`][idempotence.maintenance.worker_async.Metrics] of ``registry``
    (the default registry if None)."""
    # The lock makes "build once" hold across threads: a second Metrics on the same
    # registry would raise a duplicate-timeseries error.
    with _lock:
        return _on_registry(registry)


# -- the store's instrumentation -----------------------------------------------------------


class PrometheusInstrumentation(Instrumentation):
    """Count claims, takeovers and refused fenced writes on a store, into ``metrics``
    ([`default_metrics`][idempotence.maintenance.metrics.default_metrics] of
    ``registry`` unless given).

    ```python
    store = SqliteStore("keys.sqlite3",
                        instrumentation=PrometheusInstrumentation())
    ```
    """

    def __init__(self, metrics: Metrics | None = None, *, registry: Any = None) -> None:
        self.metrics = metrics if metrics is not None else default_metrics(registry)

    @property
    def enabled(self) -> bool:
        return self.metrics.enabled

    def claim(self, request: ClaimRequest) -> Watch[Claim]:
        return _ClaimTimer(self.metrics) if self.metrics.enabled else NO_WATCH

    def lock_lost(self, operation: str, error: LockLost) -> None:
        self.metrics.lock_lost(operation)

    def cache(self, event: str) -> None:
        self.metrics.cache(event)

    def message(self, consumer: str, outcome: str) -> None:
        self.metrics.message(consumer, outcome)


class _ClaimTimer(Watch["Claim"]):
    """Times one claim and counts it by outcome when it ends, raised or not."""

    __slots__ = ("_claim", "_metrics", "_started")

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._claim: Claim | None = None
        self._started = 0.0

    def __enter__(self) -> Watch[Claim]:
        self._started = time.perf_counter()
        return self

    def done(self, result: Claim) -> Claim:
        self._claim = result
        return result

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        seconds = time.perf_counter() - self._started
        claim = self._claim
        if claim is None:
            self._metrics.claimed(CLAIM_ERROR, seconds)
        else:
            self._metrics.claimed(claim.outcome.value, seconds, took_over=claim.took_over)
