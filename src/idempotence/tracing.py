"""OpenTelemetry spans around claims, flow runs, phases and foreign calls (F5), when
opentelemetry-api is installed (``pip install 'idempotence[otel]'``); without it,
[`OpenTelemetryInstrumentation`][idempotence.tracing.OpenTelemetryInstrumentation] is
disabled and a store drops it.

```python
store = PostgresStore(url, instrumentation=OpenTelemetryInstrumentation())
```

A run of a flow is one span with a child for its claim, each atomic phase and each
foreign call, so a trace shows where a request spent its time and where it resumed:

* ``idempotence.flow <flow>``: ``idempotence.flow``, ``.scope``, ``.key``, ``.method``,
  ``.path``; when it ends, ``idempotence.result`` (``executed``, ``replayed``, ``lost``…)
  and ``idempotence.response.status``;
* ``idempotence.claim``: ``idempotence.scope``, ``.key``, ``.flow``; then
  ``idempotence.outcome``, ``.recovery_point`` (where the run resumes), ``.lock_token``,
  ``.takeover`` and, for a conflict, ``.retry_after``;
* ``idempotence.phase <recovery point>``: ``idempotence.flow``, ``.recovery_point``;
  then ``idempotence.phase.result`` (``advance``, ``finish``, ``noop``) and
  ``idempotence.next_recovery_point`` or ``.response.status``;
* ``idempotence.call <name>``: ``idempotence.flow``, ``.call``, ``.derived_key``,
  ``.idempotent``.

A refused fenced write (F1) adds an ``idempotence.lock_lost`` event to the current
span. Request bodies and parameters are never recorded. Spans go to the global tracer
provider unless one is given.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from .flows import Advance, Finish, FlowResult, NoOp, PhaseResult, Reject, ResultKind
from .observability import NO_WATCH, Instrumentation, Watch
from .states import Claim, ClaimRequest, Outcome

if TYPE_CHECKING:
    from .errors import LockLost

otel_trace: Any
otel_context: Any
try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
except ImportError:  # pragma: no cover - exercised only without the extra
    otel_trace = otel_context = None

AVAILABLE = otel_trace is not None
"""True when opentelemetry-api is installed and spans are made."""

TRACER_NAME = "idempotence"
"""The instrumentation scope the spans are reported under."""

_T = TypeVar("_T")

_FAILED_RESULTS = frozenset({ResultKind.FAILED, ResultKind.ERRORED, ResultKind.LOST})
"""Flow results that mean the run did not do its work: its span gets an error status."""


class OpenTelemetryInstrumentation(Instrumentation):
    """Spans for the store's claims and the runs of the flows on it.

    ``tracer_provider`` is where they go (the global provider if None).
    """

    def __init__(self, tracer_provider: Any = None) -> None:
        self._tracer: Any = None
        if otel_trace is not None:
            from . import __version__

            self._tracer = otel_trace.get_tracer(
                TRACER_NAME, __version__, tracer_provider=tracer_provider
            )

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def claim(self, request: ClaimRequest) -> Watch[Claim]:
        if self._tracer is None:
            return NO_WATCH
        attributes = {
            "idempotence.scope": request.scope,
            "idempotence.key": request.key,
            "idempotence.flow": request.flow,
        }
        return _Span(self._tracer, "idempotence.claim", attributes, _claim_attributes)

    def run(self, flow: str, request: ClaimRequest) -> Watch[FlowResult]:
        if self._tracer is None:
            return NO_WATCH
        attributes = {
            "idempotence.flow": flow,
            "idempotence.scope": request.scope,
            "idempotence.key": request.key,
            "idempotence.method": request.method,
            "idempotence.path": request.path,
        }
        return _Span(self._tracer, f"idempotence.flow {flow}", attributes, _result_attributes)

    def phase(self, flow: str, recovery_point: str) -> Watch[PhaseResult]:
        if self._tracer is None:
            return NO_WATCH
        attributes = {"idempotence.flow": flow, "idempotence.recovery_point": recovery_point}
        return _Span(
            self._tracer, f"idempotence.phase {recovery_point}", attributes, _phase_attributes
        )

    def call(self, flow: str, name: str, *, derived_key: str, idempotent: bool) -> Watch[Any]:
        if self._tracer is None:
            return NO_WATCH
        attributes = {
            "idempotence.flow": flow,
            "idempotence.call": name,
            "idempotence.derived_key": derived_key,
            "idempotence.idempotent": idempotent,
        }
        return _Span(self._tracer, f"idempotence.call {name}", attributes, None)

    def lock_lost(self, operation: str, error: LockLost) -> None:
        if self._tracer is None:
            return
        span = otel_trace.get_current_span()
        if span.is_recording():
            attributes: dict[str, Any] = {"idempotence.operation": operation}
            token = error.fields.get("token")
            if isinstance(token, int):
                attributes["idempotence.lock_token"] = token
            span.add_event("idempotence.lock_lost", attributes)


# -- what each span says when its work ends ----------------------------------------------


def _claim_attributes(claim: Claim) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "idempotence.outcome": claim.outcome.value,
        "idempotence.recovery_point": claim.record.recovery_point,
    }
    if claim.lease is not None:
        attributes["idempotence.lock_token"] = claim.lease.token
        attributes["idempotence.takeover"] = claim.took_over
    if claim.outcome is Outcome.IN_PROGRESS and claim.retry_after is not None:
        attributes["idempotence.retry_after"] = claim.retry_after
    return attributes


def _result_attributes(result: FlowResult) -> dict[str, Any]:
    attributes: dict[str, Any] = {"idempotence.result": result.kind.value}
    if result.response is not None:
        attributes["idempotence.response.status"] = result.response.status
    return attributes


def _phase_attributes(result: PhaseResult) -> dict[str, Any]:
    if isinstance(result, Advance):
        return {
            "idempotence.phase.result": "advance",
            "idempotence.next_recovery_point": result.recovery_point,
        }
    if isinstance(result, Finish):
        return {
            "idempotence.phase.result": "finish",
            "idempotence.response.status": result.response.status,
        }
    assert isinstance(result, NoOp)
    return {"idempotence.phase.result": "noop"}


class _Span(Watch[_T]):
    """One span, current while the work runs (so the claim a flow's driver makes is
    its child), ended when the work ends."""

    __slots__ = ("_attributes", "_describe", "_name", "_span", "_token", "_tracer")

    def __init__(
        self,
        tracer: Any,
        name: str,
        attributes: dict[str, Any],
        describe: Any,
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._attributes = attributes
        self._describe = describe
        self._span: Any = None
        self._token: Any = None

    def __enter__(self) -> Watch[_T]:
        self._span = self._tracer.start_span(self._name, attributes=self._attributes)
        self._token = otel_context.attach(otel_trace.set_span_in_context(self._span))
        return self

    def done(self, result: _T) -> _T:
        if self._describe is not None:
            self._span.set_attributes(self._describe(result))
        if isinstance(result, FlowResult) and result.kind in _FAILED_RESULTS:
            self._span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, result.kind.value))
        return result

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self._span
        try:
            # A refusal (Reject) is an answer, not a failure of the work.
            if exc is not None and not isinstance(exc, Reject):
                span.record_exception(exc)
                span.set_status(
                    otel_trace.Status(otel_trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
                )
        finally:
            span.end()
            otel_context.detach(self._token)
