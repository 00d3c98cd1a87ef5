"""The completer (B2): drive abandoned keys to a terminal state.

A key is abandoned when it is unfinished, no live worker holds it (unlocked, or its
lock expired), and nothing has run it for a grace period: the client gave up
retrying, or crashed itself. The completer resumes it the way a retry would,
through its flow from the stored request parameters
(``flow.run(store, flow.resume_request(record))``), from the last recovery point
on: derived keys make the foreign calls it repeats harmless (R4).

Picking a key counts an attempt in the row (``completer_attempts``) and moves its
``last_run_at``, in one statement: that is the completer's lease, so two completers
never resume the same key at once, and a key whose flow keeps failing (or keeps
killing the completer) runs out of attempts. After ``max_attempts`` the key is
finished as errored, fenced like any finish, and waits for a human
(``idempotence keys list --state errored``) instead of being retried forever.

Keys whose flow is not registered in the completer's registry are counted and
logged, never touched: another service may own that flow.

>>> completer = Completer(store, flows=my_app.flows)       # doctest: +SKIP
>>> completer.run_once().completed                         # doctest: +SKIP
3
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..errors import ConfigurationError, LockLost
from ..flows import Flow, FlowRegistry, FlowResult, ResultKind
from ..flows import flows as default_flows
from ..problems import Problem, ProblemDetails
from ..states import KeyRecord, Outcome
from ..stores import Store
from . import _ops
from ._ops import PickedKey
from ._service import Progress, Service, ServiceConfig, Signals, _invalid
from .metrics import Metrics


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleterConfig(ServiceConfig):
    """The completer's settings; see :class:`ServiceConfig`."""

    #: Flows run one key after another, so batches are small.
    batch_size: int = 20
    #: How long a key must have been left alone before the completer takes it: the
    #: client's own retries come first.
    grace: timedelta = timedelta(minutes=5)
    #: Attempts before a key is errored and left for a human.
    max_attempts: int = 5

    def validate(self) -> None:
        ServiceConfig.validate(self)
        if self.grace < timedelta(0):
            raise _invalid(self, "grace", self.grace, "must not be negative")
        if self.max_attempts < 1:
            raise _invalid(self, "max_attempts", self.max_attempts, "must be at least 1")


class CompletionOutcome(enum.Enum):
    """How the completer's attempt at one key ended."""

    #: The flow finished the key: its response is stored.
    COMPLETED = "completed"
    #: The flow stored an indeterminate foreign failure (R6): errored, for a human.
    ERRORED = "errored"
    #: Out of attempts: the completer errored the key, for a human.
    GAVE_UP = "gave_up"
    #: The flow failed and released the key; a later pass tries again.
    FAILED = "failed"
    #: A phase asked to be resumed later (NoOp): progress, so the key's attempts
    #: start again.
    PAUSED = "paused"
    #: The flow refused the request before its first phase: the key was forgotten.
    REJECTED = "rejected"
    #: Another worker finished or took the key in the meantime.
    SKIPPED = "skipped"
    #: Another worker took the key over mid-run; this run's writes were refused (F1).
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class Completion:
    """One key the completer attempted."""

    scope: str
    key: str
    flow: str
    outcome: CompletionOutcome
    #: Completer attempts at this key so far, this one included.
    attempts: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CompleteResult:
    """What one pass of the completer did."""

    completions: tuple[Completion, ...]
    #: Abandoned keys left alone because their flow is not registered, per flow.
    unregistered: Mapping[str, int] = field(default_factory=dict)
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


#: What a key the completer gave up on answers to every retry.
GAVE_UP_RESPONSE = ProblemDetails.of(
    Problem.REQUEST_ABANDONED,
    "The request could not be completed after repeated attempts and is on hold for an "
    "operator. Retrying it returns this answer.",
).stored()

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


class Completer(Service[CompleterConfig, CompleteResult]):
    """Resumes abandoned keys through ``flows`` (B2); see the module docstring.

    A stop takes effect after the current batch: a picked key has had its attempt
    counted, and leaving it would spend an attempt for nothing.
    """

    name = "completer"

    def __init__(
        self,
        store: Store,
        config: CompleterConfig | None = None,
        *,
        flows: FlowRegistry | None = None,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(store, config or CompleterConfig(), signals=signals, metrics=metrics)
        self.flows = flows if flows is not None else default_flows

    def _pass(self, stop: threading.Event, progress: Progress | None) -> CompleteResult:
        started = time.monotonic()
        d, cfg = self.store.dialect, self.config
        names = sorted(flow.name for flow in self.flows)
        # Keys run during this pass are newer than this, so no pass picks one twice.
        since = self.store.perform(lambda: _ops.db_now(d), write=False)
        unregistered = self.store.perform(
            lambda: _ops.abandoned_unregistered(d, names, since, cfg.grace, cfg.query_timeout)
        )
        for flow_name, keys in unregistered.items():
            self.log.warning(
                "%d abandoned key(s) of flow %r, which is not registered here: left alone",
                keys,
                flow_name,
                extra={"service": self.name, "flow": flow_name, "count": keys},
            )
        completions: list[Completion] = []

        def batch() -> int:
            picked = self.store.perform(
                lambda: _ops.pick_abandoned(
                    d, names, since, cfg.grace, cfg.batch_size, cfg.query_timeout
                )
            )
            for key in picked:
                completion = self._complete(key)
                self.metrics.keys_completed(completion.outcome.value)
                completions.append(completion)
            return len(picked)

        batches = self._drain("resumed", batch, stop, progress) if names else 0
        return CompleteResult(tuple(completions), unregistered, batches, time.monotonic() - started)

    def _complete(self, picked: PickedKey) -> Completion:
        record, attempts = picked.record, picked.attempts
        try:
            flow = self.flows.get(record.flow)
        except ConfigurationError:  # unregistered since the pick
            return self._report(record, CompletionOutcome.SKIPPED, attempts, None)
        if attempts > self.config.max_attempts:
            # The previous attempt never reported back (it crashed the completer).
            return self._give_up(flow, record, attempts - 1, None)
        result: FlowResult | None = None
        try:
            result = flow.run(self.store, flow.resume_request(record))
        except Exception as exc:  # the store failed, or the engine has a bug
            self.log.exception("resuming key %r failed", record.key, extra=_fields(record))
            error: str | None = repr(exc)
        else:
            self.metrics.flow_result(result)
            error = None if result.error is None else repr(result.error)
        outcome = _outcome(result)
        if outcome is CompletionOutcome.PAUSED:
            d = self.store.dialect
            self.store.perform(lambda: _ops.reset_completer_attempts(d, record.scope, record.id))
        if outcome is CompletionOutcome.FAILED and attempts >= self.config.max_attempts:
            return self._give_up(flow, record, attempts, error)
        return self._report(record, outcome, attempts, error)

    def _give_up(
        self, flow: Flow, record: KeyRecord, attempts: int, error: str | None
    ) -> Completion:
        reason = f"the completer gave up after {attempts} attempt(s)"
        if error:
            reason += f"; last error: {error}"
        # Finish through a claim, so the write is fenced like any other (F1): a client
        # retry that took the key meanwhile wins, and this gives up nothing.
        claim = self.store.claim(flow.resume_request(record))
        if claim.outcome is not Outcome.EXECUTE or claim.lease is None:
            return self._report(record, CompletionOutcome.SKIPPED, attempts, error)
        try:
            self.store.finish(claim.lease, GAVE_UP_RESPONSE, error=reason)
        except LockLost:
            self.metrics.fence_rejected()
            return self._report(record, CompletionOutcome.LOST, attempts, error)
        return self._report(record, CompletionOutcome.GAVE_UP, attempts, reason)

    def _report(
        self, record: KeyRecord, outcome: CompletionOutcome, attempts: int, error: str | None
    ) -> Completion:
        level = {
            CompletionOutcome.GAVE_UP: logging.ERROR,
            CompletionOutcome.ERRORED: logging.ERROR,
            CompletionOutcome.FAILED: logging.WARNING,
            CompletionOutcome.LOST: logging.WARNING,
        }.get(outcome, logging.INFO)
        self.log.log(
            level,
            "key %r in scope %r (flow %r): %s",
            record.key,
            record.scope,
            record.flow,
            outcome.value,
            extra={
                **_fields(record),
                "service": self.name,
                "outcome": outcome.value,
                "attempts": attempts,
                "error": error,
            },
        )
        return Completion(record.scope, record.key, record.flow, outcome, attempts, error)

    def _summary(self, result: CompleteResult) -> tuple[str, dict[str, Any]]:
        counts = {o.value: result.count(o) for o in CompletionOutcome if result.count(o)}
        text = ", ".join(f"{n} {what}" for what, n in counts.items()) or "nothing to do"
        skipped = sum(result.unregistered.values())
        if skipped:
            text += f"; {skipped} key(s) of unregistered flows left alone"
        return (
            f"resumed {len(result.completions)} abandoned key(s): {text}",
            {"count": len(result.completions), "batches": result.batches, **counts},
        )


def _outcome(result: FlowResult | None) -> CompletionOutcome:
    if result is None:
        return CompletionOutcome.FAILED
    if result.kind is ResultKind.FAILED:
        # A flow that stores server errors finished the key with its 500.
        return CompletionOutcome.COMPLETED if result.stored else CompletionOutcome.FAILED
    return _KINDS[result.kind]


def _fields(record: KeyRecord) -> dict[str, Any]:
    return {
        "scope": record.scope,
        "key": record.key,
        "flow": record.flow,
        "recovery_point": record.recovery_point,
    }
