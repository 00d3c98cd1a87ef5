"""What a flow driver does around a step, sync or async alike: how a phase's result
closes its transaction, the store's instrumentation around it, and what the observer
is told after a foreign call. The driver is `_driver_async` (the source) and
`_driver` (generated from it).
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError, Indeterminate
from ..observability import NO_WATCH, Instrumentation, Watch
from ..states import FINISHED, STARTED
from .contexts import Observer, PhaseContext
from .effects import DoCall, DoInTransaction, DoPhase, OverflowNotStored
from .results import Advance, Finish, NoOp

NOT_SYNC = "{} returned a coroutine: run the flow with run_async"
"""How the sync driver refuses a coroutine from a phase or a foreign call."""


def closing(result: Any, ctx: PhaseContext) -> dict[str, Any]:
    """How a phase's result closes its transaction (``end_phase`` arguments).

    An advance to a recovery point without a step is refused before it commits: the
    key would be stranded there (and ``finished`` without a response is no finish).
    """
    flow = ctx.flow
    if isinstance(result, Advance):
        point = result.recovery_point
        if point not in flow.steps:
            hint = "; end the flow with Finish(response)" if point == FINISHED else ""
            raise ConfigurationError(
                f"a phase of flow {flow.name!r} advanced to {point!r}, where it has no step{hint}"
            )
        return {"recovery_point": point}
    if isinstance(result, Finish):
        return {"response": result.response}
    if isinstance(result, NoOp):
        # Stay at the step's own point. The checkpoint clears the lease's calling: after
        # a non-idempotent call that returned, its outcome is known and recorded, and a
        # calling left behind would make the next attempt take the key for crashed
        # mid-call.
        return {"recovery_point": ctx.lease.recovery_point}
    raise ConfigurationError(
        f"a phase must return Advance, Finish or NoOp, not {type(result).__name__}"
    )


def watch(
    instrumentation: Instrumentation | None, effect: DoPhase | DoCall | DoInTransaction
) -> Watch[Any]:
    """The store's instrumentation around a phase or a foreign call (nothing without
    one). A phase is named by its step's recovery point, as the observer names it."""
    if instrumentation is None:
        return NO_WATCH
    if isinstance(effect, DoCall):
        lease = effect.lease
        return instrumentation.call(
            effect.flow.name,
            effect.step.name,
            derived_key=effect.flow.key_for(lease.id, effect.step.name),
            idempotent=effect.step.idempotent,
        )
    if isinstance(effect, DoInTransaction):
        return instrumentation.phase(effect.flow.name, STARTED)
    return instrumentation.phase(effect.context.flow.name, effect.context.lease.recovery_point)


def after_call(observer: Observer | None, effect: DoCall) -> None:
    """Tell ``observer`` that the call returned. Should it raise (a harness aborting
    the run right there), the call did take effect: say so with an indeterminate
    failure, never a plain one, which would let a non-idempotent call run again."""
    if observer is None:
        return
    try:
        observer(effect.event("after"))
    except Exception as exc:
        raise Indeterminate(
            f"the run was aborted after the call {effect.step.name!r} returned"
        ) from exc


def require_finish(result: Any) -> None:
    if not isinstance(result, Finish):
        raise ConfigurationError("the phase of a request-as-transaction flow must return Finish")


def unsent(failed: list[OverflowNotStored]) -> None:
    """Raise the failed finish of a too-large response, if there was one (see
    [`DoHandle`][idempotence.http.wsgi.DoHandle]): the engine must hear of it whatever
    the app did with the exception."""
    if failed:
        raise failed[0]
