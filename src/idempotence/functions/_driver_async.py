"""Run a guarded call through the engine on a store (`_guard` decides).

`call_async` is the source; `call` is
generated from it (F7). Every effect is the engine's and is performed by the flows
driver (`drive_async`): the claim, the wait for a twin (P10), the function with its
heartbeats (F2) or inside the claim's transaction (F3), and the settling of the key.
Only calling the function is this module's own.
"""

from __future__ import annotations

from typing import Any

from .._awaitables import settle_async
from ..flows._driver_async import drive_async
from ..flows.effects import DoHandle
from ..flows.flow import watched
from ..flows.results import Captured
from ..stores import AsyncKeyStore
from ._guard import CURRENT_CALL, CallState, Guard

_NOT_SYNC = "a function guarded with a sync store must not be async"


class _AsyncCall(CallState):
    """Runs the function for the engine, with the call's context set
    ([`current_call`][idempotence.functions.current_call])."""

    __slots__ = ()

    async def run_app(self, run: DoHandle, tx: Any, overflow: Any) -> Captured:
        token = self.enter(run.lease, tx)
        guard = self.guard
        try:
            value = await settle_async(guard.fn(*self.args, **self.kwargs), _NOT_SYNC)
        except guard.final as exc:
            return self.failed(exc)
        finally:
            CURRENT_CALL.reset(token)
        return self.returned(value)


async def call_async(
    guard: Guard, store: AsyncKeyStore, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Call ``guard``'s function with ``args`` and ``kwargs``, guarded on ``store``:
    return its value (this run's, or the stored one), or raise."""
    request, _ = guard.request(args, kwargs)
    state = _AsyncCall(guard, request, args, kwargs)
    engine = guard.run(request, state, guard.wait)
    instrumentation = getattr(store, "instrumentation", None)
    if instrumentation is not None:
        engine = watched(instrumentation, guard.name, request, engine)
    return guard.outcome(await drive_async(engine, store), state)
