"""The one engine (F6): resumable flows of atomic phases, recovery points and foreign
calls (DESIGN 5, F1-F3), and the application handler as a third step kind.

A [`Flow`][idempotence.testing.harness.Flow] is a small DAG of steps keyed by recovery
point. Running it claims the key and then loops: read the recovery point, run the step
registered there, commit, repeat, until a step finishes with a response (R1).

* An **atomic phase** runs in ONE transaction on the store's database; the phase's own
  writes go through ``ctx.tx`` and commit together with the checkpoint, which is the
  transaction's last statement and is fenced by the lock token (R2, F1).
* An **application handler** ([`Flow.handler`][idempotence.flows.flow.Flow.handler],
  [`handler`][idempotence.flows.flow.Flow.handler]) runs the entry point's handler with
  no transaction open, on any key store, and settles the key by the response's status
  (R5); in a request-as-transaction flow it is the body of the one atomic phase (F3).
  Every HTTP endpoint that is not a flow is such a run.
* A **foreign step** calls something outside the database (a payment provider) with
  no transaction open, using a key derived from the key row (R3, R4), and then records
  the call's result in an atomic phase. A crash between the call and the record makes
  the next attempt call again with the SAME derived key, and the provider's own
  idempotency absorbs the repeat. A call marked ``idempotent=False`` is never repeated
  blindly: the checkpoint just before it names it in the key's ``calling`` column, so
  a crash during the call, or an indeterminate failure, makes the key errored, for a
  human (R6).

```python
rides = Flow("rides")
@rides.phase("started")
def create_ride(ctx: PhaseContext) -> Advance:
    ctx.tx.execute("INSERT INTO rides (key_id) VALUES (?)", (ctx.lease.id,))
    return Advance("ride_created")
rides.foreign(
    "ride_created", name="charge",
    call=lambda ctx: provider.charge(2000, idempotency_key=ctx.key_for("charge")),
    record=lambda ctx, charge: Finish(StoredResponse.of(201, body=charge["id"])),
)
result = rides.run(store, request)
```

The engine below is written once, as a generator of effects; `_driver_async` performs
them on a sync or an async SQL store. A flow needs the SQL store's transaction shared
with its phases, so [`Flow.run`][idempotence.flows.flow.Flow.run] takes a
[`Store`][idempotence.testing.harness.Store], not a
[`KeyStore`][idempotence.stores.redis.KeyStore]: a backend without one (Redis) is
refused by type.

A run can be watched: ``run(store, request, observer=fn)`` calls ``fn(event)`` at each
boundary where a crash leaves a different state behind (the crash-injection harness,
`idempotence.testing.harness`, kills the worker there; F4):

* ``phase:<point>:before_commit``: the phase at ``<point>`` returned, its writes are
  in the open transaction, its checkpoint is not written yet;
* ``phase:<point>:after_commit``: the phase's transaction committed;
* ``call:<name>:before`` and ``call:<name>:after``: around foreign call ``<name>``,
  with no transaction open.

Metrics and traces come from the store instead: a store built with
``instrumentation=`` watches each run of a flow on it, each phase and each foreign
call ([`idempotence.observability`][idempotence.observability]).

The package holds, each in a module of its own: what a phase and a run return
(`results`), what a step is handed (`contexts`), the steps
(`steps`), the effects the engine asks for (`effects`), the flow and its
engine (`flow`), and the driver that performs the effects (`_driver_async`;
`_driver` is generated from it).
"""

from ..errors import Indeterminate, Reject
from .contexts import FlowInfo, ForeignContext, Observer, PhaseContext
from .effects import (
    DoCall,
    DoCheckpoint,
    DoClaim,
    DoFinish,
    DoFinishLater,
    DoForget,
    DoHandle,
    DoInTransaction,
    DoPhase,
    DoRelease,
    DoWait,
    Effect,
    Engine,
    HandlerBody,
)
from .flow import Flow, FlowRegistry, flows
from .results import (
    PAUSED_RESPONSE,
    SERVER_ERROR,
    STORED_SERVER_ERROR,
    Advance,
    Captured,
    Finish,
    FlowResult,
    NoOp,
    PhaseResult,
    ResultKind,
    indeterminate_response,
    problem,
)
from .steps import (
    INDETERMINATE,
    AtomicStep,
    CallFn,
    ForeignStep,
    HandlerStep,
    PhaseFn,
    RecordFn,
    Settle,
    Step,
)

__all__ = [
    "INDETERMINATE",
    "PAUSED_RESPONSE",
    "SERVER_ERROR",
    "STORED_SERVER_ERROR",
    "Advance",
    "AtomicStep",
    "CallFn",
    "Captured",
    "DoCall",
    "DoCheckpoint",
    "DoClaim",
    "DoFinish",
    "DoFinishLater",
    "DoForget",
    "DoHandle",
    "DoInTransaction",
    "DoPhase",
    "DoRelease",
    "DoWait",
    "Effect",
    "Engine",
    "Finish",
    "Flow",
    "FlowInfo",
    "FlowRegistry",
    "FlowResult",
    "HandlerBody",
    "HandlerStep",
    "ForeignContext",
    "ForeignStep",
    "Indeterminate",
    "NoOp",
    "Observer",
    "PhaseContext",
    "PhaseFn",
    "PhaseResult",
    "RecordFn",
    "Reject",
    "ResultKind",
    "Settle",
    "Step",
    "flows",
    "indeterminate_response",
    "problem",
]
