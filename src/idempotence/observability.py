"""Instrumentation: what a key store and the flows on it tell the outside (F5).

A store built with ``instrumentation=`` reports every claim (its outcome, whether it
took a key over, how long it took) and every write its fencing token refused (F1);
the flows that run on the store, and so the HTTP middleware, report each run, atomic
phase and foreign call through the same object. Enabling it is one keyword:

```python
from idempotence.metrics import PrometheusInstrumentation
from idempotence.tracing import OpenTelemetryInstrumentation
store = PostgresStore(url, instrumentation=combine(
    PrometheusInstrumentation(), OpenTelemetryInstrumentation()))
```

Without it (the default) a claim pays one ``is None`` test. The seam is one object for
sync and async stores alike: every hook is plain synchronous code that wraps the work,
awaited or not, in a [`Watch`][idempotence.observability.Watch] (a context manager told
the result). Hooks only report; what happens to a key is decided elsewhere
(`idempotence.states`, the flow engine) and never here.

Write your own by subclassing
[`Instrumentation`][idempotence.observability.Instrumentation] and overriding what you
need.

One module per meaning: this one is the interface; [`idempotence.metrics`][idempotence.metrics] its
Prometheus implementation (the background services count there too),
[`idempotence.tracing`][idempotence.tracing] its OpenTelemetry one, and `idempotence.logs` the
formatter that shows the fields the library logs with. ``idempotence.maintenance.metrics``
and ``idempotence.maintenance.logs`` are old import paths of the last two, kept working.
"""

from __future__ import annotations

from collections.abc import Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .errors import LockLost

if TYPE_CHECKING:
    from .flows.results import FlowResult, PhaseResult
    from .states import Claim, ClaimRequest

_T = TypeVar("_T")
_R = TypeVar("_R")


class Watch(Generic[_T]):
    """What a hook returns: a context manager around one piece of work, told its result
    by [`done`][idempotence.observability.Watch.done] when there is one. This one
    watches nothing.

    ```python
    with instrumentation.claim(request) as watch:
        claim = watch.done(run_the_claim())
    ```
    """

    __slots__ = ()

    def __enter__(self) -> Watch[_T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def done(self, result: _T) -> _T:
        """Note the work's ``result`` and hand it back."""
        return result


NO_WATCH: Watch[Any] = Watch()
"""The watch of a hook that watches nothing; it keeps no state, so one serves all."""


class Instrumentation:
    """The hooks a store and its flows call. Every hook here does nothing: subclass and
    override the ones you need, or use
    [`PrometheusInstrumentation`][idempotence.metrics.PrometheusInstrumentation] and
    [`OpenTelemetryInstrumentation`][idempotence.tracing.OpenTelemetryInstrumentation],
    and [`combine`][idempotence.observability.combine] several.

    Hooks run on the worker's own thread or task, around the work: keep them quick,
    and never raise from them.
    """

    @property
    def enabled(self) -> bool:
        """False when the instrumentation cannot record anything (its package is not
        installed); [`combine`][idempotence.observability.combine] and the stores then drop it."""
        return True

    def claim(self, request: ClaimRequest) -> Watch[Claim]:
        """Around one claim (DESIGN 4), told the [`Claim`][idempotence.states.Claim]."""
        return NO_WATCH

    def run(self, flow: str, request: ClaimRequest) -> Watch[FlowResult]:
        """Around one run of flow ``flow``, claim included, told the
        [`FlowResult`][idempotence.testing.harness.FlowResult]."""
        return NO_WATCH

    def phase(self, flow: str, recovery_point: str) -> Watch[PhaseResult]:
        """Around the atomic phase at ``recovery_point`` (R2), its transaction
        included, told what the phase returned (``Advance``, ``Finish``, ``NoOp``)."""
        return NO_WATCH

    def call(self, flow: str, name: str, *, derived_key: str, idempotent: bool) -> Watch[Any]:
        """Around foreign call ``name`` (R3), made with ``derived_key`` (R4)."""
        return NO_WATCH

    def lock_lost(self, operation: str, error: LockLost) -> None:
        """A fenced write was refused (F1): ``operation`` is ``checkpoint``,
        ``finish``, ``release``, ``heartbeat`` or ``forget``."""

    def cache(self, event: str) -> None:
        """What the Redis cache in front of the store (``CachedStore``) did for one
        operation: ``hit`` (a replay served from the cache), ``miss`` (the primary
        answered), ``error`` (Redis failed or timed out: the primary answered alone)."""

    def message(self, consumer: str, outcome: str) -> None:
        """A guarded consumer settled a delivery (DESIGN 9): ``outcome`` is
        ``processed``, ``duplicate`` (absorbed), ``in_progress`` (requeued, M2),
        ``retry`` (a failed attempt, requeued), ``unavailable`` (the key store failed:
        requeued) or ``dead_letter`` (M3, or hostile)."""


class _Combined(Instrumentation):
    """Reports to each part in turn."""

    def __init__(self, parts: tuple[Instrumentation, ...]) -> None:
        self.parts = parts

    def claim(self, request: ClaimRequest) -> Watch[Claim]:
        return _Watches([part.claim(request) for part in self.parts])

    def run(self, flow: str, request: ClaimRequest) -> Watch[FlowResult]:
        return _Watches([part.run(flow, request) for part in self.parts])

    def phase(self, flow: str, recovery_point: str) -> Watch[PhaseResult]:
        return _Watches([part.phase(flow, recovery_point) for part in self.parts])

    def call(self, flow: str, name: str, *, derived_key: str, idempotent: bool) -> Watch[Any]:
        return _Watches(
            [
                part.call(flow, name, derived_key=derived_key, idempotent=idempotent)
                for part in self.parts
            ]
        )

    def lock_lost(self, operation: str, error: LockLost) -> None:
        for part in self.parts:
            part.lock_lost(operation, error)

    def cache(self, event: str) -> None:
        for part in self.parts:
            part.cache(event)

    def message(self, consumer: str, outcome: str) -> None:
        for part in self.parts:
            part.message(consumer, outcome)


class _Watches(Watch[_T]):
    """Several watches as one: entered in order, left in reverse, like nested ``with``."""

    __slots__ = ("_watches",)

    def __init__(self, watches: list[Watch[_T]]) -> None:
        self._watches = watches

    def __enter__(self) -> Watch[_T]:
        for watch in self._watches:
            watch.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for watch in reversed(self._watches):
            watch.__exit__(exc_type, exc, tb)

    def done(self, result: _T) -> _T:
        for watch in self._watches:
            watch.done(result)
        return result


def combine(*parts: Instrumentation | None) -> Instrumentation | None:
    """One instrumentation reporting to every enabled part; None when there is none,
    so a store given it pays nothing.

    ```python
    combine(PrometheusInstrumentation(), OpenTelemetryInstrumentation())
    ```
    """
    live = tuple(part for part in parts if part is not None and part.enabled)
    if not live:
        return None
    if len(live) == 1:
        return live[0]
    return _Combined(live)


def fenced(
    instrumentation: Instrumentation | None, operation: str, op: Generator[Any, Any, _R]
) -> Generator[Any, Any, _R]:
    """A store operation that tells ``instrumentation`` when its fenced write is
    refused (F1). Without instrumentation, ``op`` itself: nothing is added."""
    if instrumentation is None:
        return op
    return _reporting_lock_lost(instrumentation, operation, op)


def watched_claim(
    instrumentation: Instrumentation | None,
    request: ClaimRequest,
    op: Generator[Any, Any, Claim],
) -> Generator[Any, Any, Claim]:
    """A claim operation that ``instrumentation`` watches while its statements run
    (and no longer: a claim that opens a transaction does not time the transaction).
    Without instrumentation, ``op`` itself."""
    if instrumentation is None:
        return op
    return _watching_claim(instrumentation, request, op)


def _watching_claim(
    instrumentation: Instrumentation, request: ClaimRequest, op: Generator[Any, Any, Claim]
) -> Generator[Any, Any, Claim]:
    with instrumentation.claim(request) as watch:
        return watch.done((yield from op))


def _reporting_lock_lost(
    instrumentation: Instrumentation, operation: str, op: Generator[Any, Any, _R]
) -> Generator[Any, Any, _R]:
    try:
        return (yield from op)
    except LockLost as lost:
        instrumentation.lock_lost(operation, lost)
        raise
