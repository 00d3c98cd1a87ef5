"""The completer (B2): drive abandoned keys to a terminal state.

A key is abandoned when it is unfinished, no live worker holds it (unlocked, or its
lock expired), and nothing has run it for a grace period: the client gave up
retrying, or crashed itself. The completer resumes it the way a retry would,
through its flow from the stored request parameters
(``flow.run_async(store, flow.resume_request(record))``), from the last recovery
point on: derived keys make the foreign calls it repeats harmless (R4).

Picking a key counts an attempt in the row (``completer_attempts``) and moves its
``last_run_at``, in one statement: that is the completer's lease, so two completers
never resume the same key at once, and a key whose flow keeps failing (or keeps
killing the completer) runs out of attempts. After ``max_attempts`` the key is
finished as errored, fenced like any finish, and waits for a human
(``idempotence keys list --state errored``) instead of being retried forever.

Keys whose flow is not registered in the completer's registry are counted and
logged, never touched: another service may own that flow.

On an async store the completer resumes flows whose phases and foreign calls are
coroutines as well as plain ones, so an application written async registers its one
flow, not a blocking twin of it for the completer (F7). On a sync store a coroutine
step fails the run, and the key is retried until it is given up on.

```python
completer = AsyncCompleter(store, flows=my_app.flows)
(await completer.run_once()).completed
# 3
```
"""

from __future__ import annotations

import time
from typing import Any

from .._concurrency import AsyncEvent
from ..errors import ConfigurationError, LockLost
from ..flows import Flow, FlowRegistry, FlowResult
from ..flows import flows as default_flows
from ..flows._driver_async import drive_async
from ..flows.flow import finish_errored
from ..metrics import Metrics
from ..states import KeyRecord, Outcome
from ..stores import AsyncStore
from . import _ops
from ._completer_shared import (
    GAVE_UP_RESPONSE,
    CompleterConfig,
    CompleteResult,
    Completion,
    CompletionOutcome,
    complete_summary,
    give_up_reason,
    key_fields,
    log_unregistered,
    outcome_of,
    report,
)
from ._ops import PickedKey
from ._service_async import AsyncService
from ._service_shared import Progress, Signals

__all__ = [
    "GAVE_UP_RESPONSE",
    "AsyncCompleter",
    "CompleteResult",
    "CompleterConfig",
    "Completion",
    "CompletionOutcome",
]


class AsyncCompleter(AsyncService[CompleterConfig, CompleteResult]):
    """Resumes abandoned keys through ``flows`` (B2); see the module docstring.

    A stop takes effect after the current batch: a picked key has had its attempt
    counted, and leaving it would spend an attempt for nothing.
    """

    name = "completer"

    def __init__(
        self,
        store: AsyncStore,
        config: CompleterConfig | None = None,
        *,
        flows: FlowRegistry | None = None,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(store, config or CompleterConfig(), signals=signals, metrics=metrics)
        self.flows = flows if flows is not None else default_flows

    async def _pass(self, stop: AsyncEvent, progress: Progress | None) -> CompleteResult:
        started = time.monotonic()
        cfg = self.config
        names = sorted(flow.name for flow in self.flows)
        # Keys run during this pass are newer than this, so no pass picks one twice.
        since = await self.store._perform(lambda d: _ops.db_now(d), write=False)
        unregistered = await self.store._perform(
            lambda d: _ops.abandoned_unregistered(d, names, since, cfg.grace, cfg.query_timeout)
        )
        log_unregistered(self.log, self.name, unregistered)
        completions: list[Completion] = []

        async def batch() -> int:
            picked = await self.store._perform(
                lambda d: _ops.pick_abandoned(
                    d, names, since, cfg.grace, cfg.batch_size, cfg.query_timeout
                )
            )
            for key in picked:
                completion = await self._complete(key)
                self.metrics.keys_completed(completion.outcome.value)
                completions.append(completion)
            return len(picked)

        batches = await self._drain("resumed", batch, stop, progress) if names else 0
        return CompleteResult(tuple(completions), unregistered, batches, time.monotonic() - started)

    async def _complete(self, picked: PickedKey) -> Completion:
        record, attempts = picked.record, picked.attempts
        try:
            flow = self.flows.get(record.flow)
        except ConfigurationError:  # unregistered since the pick
            return self._report(record, CompletionOutcome.SKIPPED, attempts, None)
        if attempts > self.config.max_attempts:
            # The previous attempt never reported back (it crashed the completer).
            return await self._give_up(flow, record, attempts - 1, None)
        result: FlowResult | None = None
        try:
            result = await flow.run_async(self.store, flow.resume_request(record))
        except Exception as exc:  # the store failed, or the engine has a bug
            self.log.exception("resuming key %r failed", record.key, extra=key_fields(record))
            error: str | None = repr(exc)
        else:
            self.metrics.flow_result(result)
            error = None if result.error is None else repr(result.error)
        outcome = outcome_of(result)
        if outcome is CompletionOutcome.PAUSED:
            await self.store._perform(
                lambda d: _ops.reset_completer_attempts(d, record.scope, record.key, record.id)
            )
        if outcome is CompletionOutcome.FAILED and attempts >= self.config.max_attempts:
            return await self._give_up(flow, record, attempts, error)
        return self._report(record, outcome, attempts, error)

    async def _give_up(
        self, flow: Flow, record: KeyRecord, attempts: int, error: str | None
    ) -> Completion:
        reason = give_up_reason(attempts, error)
        # Finish through a claim, so the write is fenced like any other (F1): a client
        # retry that took the key meanwhile wins, and this gives up nothing.
        errored = finish_errored(flow.resume_request(record), GAVE_UP_RESPONSE, reason)
        try:
            claim = await drive_async(errored, self.store)
        except LockLost:
            self.metrics.fence_rejected()
            return self._report(record, CompletionOutcome.LOST, attempts, error)
        if claim.outcome is not Outcome.EXECUTE:
            return self._report(record, CompletionOutcome.SKIPPED, attempts, error)
        return self._report(record, CompletionOutcome.GAVE_UP, attempts, reason)

    def _report(
        self, record: KeyRecord, outcome: CompletionOutcome, attempts: int, error: str | None
    ) -> Completion:
        return report(self.log, self.name, record, outcome, attempts, error)

    def _summary(self, result: CompleteResult) -> tuple[str, dict[str, Any]]:
        return complete_summary(result)
