"""Crash injection for the demo's API workers: die at a chosen point of a request.

The orchestrator decides, per request, whether the worker that handles it dies, and
where; it says so in the ``X-Demo-Crash`` header. The worker then SIGKILLs itself at
the first of these points that the request reaches at or after the chosen one:

==========================  ============================================================
``ride:before_commit``      the ride and audit rows are written, not committed
``charge:before``           the ride is committed; the provider is not called yet
``charge:after``            the provider charged the card; nothing recorded it
``record:before_commit``    the charge is written on the ride, not committed
``finish:before_commit``    the receipt job is staged, the response not stored
``respond``                 the response is stored (or replayed), not sent
==========================  ============================================================

"At or after" makes every chosen crash happen: a retry that resumes past the chosen
point dies at the next one, and ``respond`` is reached by every answer. So the crash
rate the orchestrator asks for is the rate at which workers die.

``X-Demo-Delay: SECONDS`` makes the request wait that long before calling the
provider, so that a test can hold a key in progress.

The hooks only exist in a worker started with chaos enabled (the demo's own run);
``idempotence demo serve`` never honours them. They reach the flow's phases through a
context variable, which follows the request from the ASGI middleware into the flow
because the idempotency middleware runs the flow on the request's own task.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "CRASH_HEADER",
    "DELAY_HEADER",
    "POINTS",
    "ChaosMiddleware",
    "pause",
    "reached",
]

CRASH_HEADER = "x-demo-crash"
DELAY_HEADER = "x-demo-delay"
POINTS = (
    "ride:before_commit",
    "charge:before",
    "charge:after",
    "record:before_commit",
    "finish:before_commit",
    "respond",
)
MAX_DELAY = 10.0
"""The longest delay a request may ask for: a test's, never a way to pin a worker."""
HEARTBEAT_EVERY = 0.1
"""How often a delayed request extends its lock: well within the shortest lock timeout."""


@dataclass(frozen=True, slots=True)
class _Plan:
    crash_at: int | None
    """Index in POINTS of the first point to die at; None: do not die."""
    delay: float


_plan: ContextVar[_Plan | None] = ContextVar("idempotence_demo_chaos", default=None)


def reached(point: str) -> None:
    """Die here if the current request asked to die at ``point`` or before it."""
    plan = _plan.get()
    if plan is None or plan.crash_at is None:
        return
    if POINTS.index(point) >= plan.crash_at:
        # SIGKILL, not an exception: nothing of ours runs after it, no rollback, no
        # finally, no unlock; exactly what a power cut or an OOM kill leaves behind.
        os.kill(os.getpid(), signal.SIGKILL)


async def pause(heartbeat: Callable[[], Any] | None = None) -> None:
    """Sleep as long as the current request asked (``X-Demo-Delay``), calling
    ``heartbeat()`` (awaiting it if need be) every `HEARTBEAT_EVERY` seconds.

    A slow call must extend its lock (F2): past the lock timeout, the sweeper or a
    retry takes the key over, and this run's next write is refused (F1).
    """
    plan = _plan.get()
    left = 0.0 if plan is None else plan.delay
    while left > 0:
        step = min(left, HEARTBEAT_EVERY)
        await asyncio.sleep(step)
        left -= step
        if heartbeat is not None:
            beat = heartbeat()
            if inspect.isawaitable(beat):
                await beat


def _plan_of(headers: list[tuple[bytes, bytes]]) -> _Plan | None:
    crash_at: int | None = None
    delay = 0.0
    for name, value in headers:
        if name.lower() == CRASH_HEADER.encode():
            point = value.decode("latin-1").strip()
            if point in POINTS:
                crash_at = POINTS.index(point)
        elif name.lower() == DELAY_HEADER.encode():
            try:
                delay = min(max(float(value.decode("latin-1")), 0.0), MAX_DELAY)
            except ValueError:
                delay = 0.0
    if crash_at is None and delay == 0.0:
        return None
    return _Plan(crash_at, delay)


class ChaosMiddleware:
    """Reads the chaos headers into the request's context; dies at ``respond``.

    It sits outside the idempotency middleware, so ``respond`` comes after the key is
    settled: the response is stored, and the client never receives it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        plan = _plan_of(list(scope.get("headers", ()))) if scope["type"] == "http" else None
        if plan is None:
            await self.app(scope, receive, send)
            return

        async def dying_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                reached("respond")
            await send(message)

        token = _plan.set(plan)
        try:
            await self.app(scope, receive, dying_send)
        finally:
            _plan.reset(token)
