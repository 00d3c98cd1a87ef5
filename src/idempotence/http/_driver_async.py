"""Drive a guarded request's lifecycle (`_core`) to its reply.

`drive_async` (ASGI) is the source; `drive` (WSGI, Django) is generated
from it. It performs the effects that are HTTP's own, reading the scope and the body
(the body through the server integration's ``io`` object), reading a key and
starting a flow in the background (asynchronous acceptance), reading a key's
status, and hands every other effect to the engine's one driver (`perform_async`,
F6): there is no second implementation of the claim, the settling of a key or the
request-as-transaction here.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from .._awaitables import settle_async
from .._concurrency import spawn_async
from ..flows._driver_async import perform_async
from ..stores import AsyncKeyStore, AsyncStore
from ._effects import Detach, Lifecycle, ReadBody, ReadKey, ReadStatus, Reply, ResolveScope

_SYNC_SCOPE = "the scope callable of a WSGI app must not be async"
_OWN = (ReadBody, ResolveScope, ReadKey, ReadStatus, Detach)
"""The effects performed here; every other one is the engine's."""


class AsyncIO(Protocol):
    """What the server integration does for the driver (it runs the app for the
    engine too: [`DoHandle`][idempotence.http.wsgi.DoHandle])."""

    async def read_body(self, limit: int) -> bytes:
        """The whole body; raise BodyTooLarge past ``limit`` bytes."""


async def drive_async(lifecycle: Lifecycle, store: AsyncKeyStore, io: AsyncIO) -> Reply:
    """Run ``lifecycle`` on ``store``; an exception of the app's propagates."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = lifecycle.send(value) if error is None else lifecycle.throw(error)
        except StopIteration as done:
            reply: Reply = done.value
            return reply
        value, error = None, None
        try:
            if not isinstance(effect, _OWN):
                value = await perform_async(effect, store, None)  # most effects: one check
            elif isinstance(effect, ReadBody):
                value = await io.read_body(effect.limit)
            elif isinstance(effect, ResolveScope):
                value = effect.fn(effect.request)
                if type(value) is not str:  # mostly a tenant; else awaited (or refused)
                    value = await settle_async(value, _SYNC_SCOPE)
            elif isinstance(effect, ReadKey):
                value = await store.get(effect.scope, effect.key)
            elif isinstance(effect, ReadStatus):
                value = await store.key_status(effect.scope, effect.key)
            else:
                _detach_async(effect, cast(AsyncStore, store))
        except BaseException as exc:  # the lifecycle and the engine decide, even on cancellation
            error = exc


def _detach_async(effect: Detach, store: AsyncStore) -> None:
    flow, request = effect.flow, effect.request
    spawn_async(lambda: flow.run_async(store, request), f"idempotence-{flow.name}-{request.key}")
