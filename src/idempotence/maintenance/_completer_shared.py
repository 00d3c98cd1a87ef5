"""The completer's settings, outcomes, results and log lines (B2), shared by
[`AsyncCompleter`][idempotence.maintenance.worker_async.AsyncCompleter] and the
generated [`Completer`][idempotence.maintenance.worker.Completer], and how to tell that
a flow needs the async one."""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..flows import AtomicStep, Flow, FlowResult, ForeignStep, ResultKind
from ..problems import Problem, ProblemDetails
from ..states import KeyRecord
from ._service_shared import ServiceConfig, _invalid


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleterConfig(ServiceConfig):
    """The completer's settings; see [`ServiceConfig`][idempotence.maintenance.ServiceConfig]."""

    batch_size: int = 20
    """Flows run one key after another, so batches are small."""
    grace: timedelta = timedelta(minutes=5)
    """How long a key must have been left alone before the completer takes it: the
    client's own retries come first."""
    max_attempts: int = 5
    """Attempts before a key is errored and left for a human."""

    def validate(self) -> None:
        ServiceConfig.validate(self)
        if self.grace < timedelta(0):
            raise _invalid(self, "grace", self.grace, "must not be negative")
        if self.max_attempts < 1:
            raise _invalid(self, "max_attempts", self.max_attempts, "must be at least 1")


class CompletionOutcome(enum.Enum):
    """How the completer's attempt at one key ended."""

    COMPLETED = "completed"
    """The flow finished the key: its response is stored."""
    ERRORED = "errored"
    """The flow stored an indeterminate foreign failure (R6): errored, for a human."""
    GAVE_UP = "gave_up"
    """Out of attempts: the completer errored the key, for a human."""
    FAILED = "failed"
    """The flow failed and released the key; a later pass tries again."""
    PAUSED = "paused"
    """A phase asked to be resumed later (NoOp): progress, so the key's attempts
    start again."""
    REJECTED = "rejected"
    """The flow refused the request before its first phase: the key was forgotten."""
    SKIPPED = "skipped"
    """Another worker finished or took the key in the meantime."""
    LOST = "lost"
    """Another worker took the key over mid-run; this run's writes were refused (F1)."""


@dataclass(frozen=True, slots=True)
class Completion:
    """One key the completer attempted."""

    scope: str
    key: str
    flow: str
    outcome: CompletionOutcome
    attempts: int
    """Completer attempts at this key so far, this one included."""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CompleteResult:
    """What one pass of the completer did."""

    completions: tuple[Completion, ...]
    unregistered: Mapping[str, int] = field(default_factory=dict)
    """Abandoned keys left alone because their flow is not registered, per flow."""
    batches: int = 0
    seconds: float = 0.0

    def count(self, outcome: CompletionOutcome) -> int:
        return sum(1 for c in self.completions if c.outcome is outcome)

    @property
    def completed(self) -> int:
        return self.count(CompletionOutcome.COMPLETED)

    @property
    def gave_up(self) -> int:
        return self.count(CompletionOutcome.GAVE_UP)


GAVE_UP_RESPONSE = ProblemDetails.of(
    Problem.REQUEST_ABANDONED,
    "The request could not be completed after repeated attempts and is on hold for an "
    "operator. Retrying it returns this answer.",
).stored()
"""What a key the completer gave up on answers to every retry."""

_KINDS = {
    ResultKind.EXECUTED: CompletionOutcome.COMPLETED,
    ResultKind.ERRORED: CompletionOutcome.ERRORED,
    ResultKind.PAUSED: CompletionOutcome.PAUSED,
    ResultKind.REJECTED: CompletionOutcome.REJECTED,
    ResultKind.LOST: CompletionOutcome.LOST,
    ResultKind.REPLAYED: CompletionOutcome.SKIPPED,
    ResultKind.IN_PROGRESS: CompletionOutcome.SKIPPED,
    ResultKind.MISMATCH: CompletionOutcome.SKIPPED,
}


def outcome_of(result: FlowResult | None) -> CompletionOutcome:
    """What a resumed run's result (None: the run raised) means for the key."""
    if result is None:
        return CompletionOutcome.FAILED
    if result.kind is ResultKind.FAILED:
        # A flow that stores server errors finished the key with its 500.
        return CompletionOutcome.COMPLETED if result.stored else CompletionOutcome.FAILED
    return _KINDS[result.kind]


def key_fields(record: KeyRecord) -> dict[str, Any]:
    return {
        "scope": record.scope,
        "key": record.key,
        "flow": record.flow,
        "recovery_point": record.recovery_point,
        "calling": record.calling,
    }


def give_up_reason(attempts: int, error: str | None) -> str:
    reason = f"the completer gave up after {attempts} attempt(s)"
    if error:
        reason += f"; last error: {error}"
    return reason


def log_unregistered(log: logging.Logger, service: str, unregistered: Mapping[str, int]) -> None:
    for flow_name, keys in unregistered.items():
        log.warning(
            "%d abandoned key(s) of flow %r, which is not registered here: left alone",
            keys,
            flow_name,
            extra={"service": service, "flow": flow_name, "count": keys},
        )


def report(
    log: logging.Logger,
    service: str,
    record: KeyRecord,
    outcome: CompletionOutcome,
    attempts: int,
    error: str | None,
) -> Completion:
    """Log one attempt at ``record`` and return it as a
    [`Completion`][idempotence.maintenance.completer_async.Completion]."""
    level = {
        CompletionOutcome.GAVE_UP: logging.ERROR,
        CompletionOutcome.ERRORED: logging.ERROR,
        CompletionOutcome.FAILED: logging.WARNING,
        CompletionOutcome.LOST: logging.WARNING,
    }.get(outcome, logging.INFO)
    log.log(
        level,
        "key %r in scope %r (flow %r): %s",
        record.key,
        record.scope,
        record.flow,
        outcome.value,
        extra={
            **key_fields(record),
            "service": service,
            "outcome": outcome.value,
            "attempts": attempts,
            "error": error,
        },
    )
    return Completion(record.scope, record.key, record.flow, outcome, attempts, error)


def complete_summary(result: CompleteResult) -> tuple[str, dict[str, Any]]:
    counts = {o.value: result.count(o) for o in CompletionOutcome if result.count(o)}
    text = ", ".join(f"{n} {what}" for what, n in counts.items()) or "nothing to do"
    skipped = sum(result.unregistered.values())
    if skipped:
        text += f"; {skipped} key(s) of unregistered flows left alone"
    return (
        f"resumed {len(result.completions)} abandoned key(s): {text}",
        {"count": len(result.completions), "batches": result.batches, **counts},
    )


def async_flows(flows: Iterable[Flow]) -> list[str]:
    """The names of the flows with a coroutine function for a phase or a foreign call
    (F7): only the async completer (``Flow.run_async`` on an async store) can resume
    them. ``idempotence worker`` runs the async services when there is one.

    A step that is a plain function returning an awaitable is not seen here: such an
    application says so with ``idempotence worker --async``.
    """
    found = []
    for flow in flows:
        for step in flow.steps.values():
            if isinstance(step, AtomicStep):
                fns: list[Any] = [step.fn]
            elif isinstance(step, ForeignStep):
                fns = [step.call, step.record]
            else:
                fns = []  # an application handler: its entry point runs it
            if any(inspect.iscoroutinefunction(fn) for fn in fns):
                found.append(flow.name)
                break
    return sorted(found)
