"""What the application hands back may be awaitable: a scope callable, a phase, a
foreign call. The async drivers await it; the sync ones refuse it with a clear error
(and close it, so Python does not also warn "coroutine was never awaited" far from the
cause). The generated sync drivers (scripts/unasync.py) call `settle` where
their async sources call `settle_async`.
"""

from __future__ import annotations

import inspect
from typing import Any

from .errors import ConfigurationError


async def settle_async(value: Any, refusal: str) -> Any:
    """``value``, awaited if it is awaitable."""
    if value is None or type(value) is str:
        return value  # what a scope callable returns: no need to ask inspect
    return await value if inspect.isawaitable(value) else value


def settle(value: Any, refusal: str) -> Any:
    """``value``; an awaitable is refused with ``ConfigurationError(refusal)``."""
    if value is None or type(value) is str:
        return value
    if inspect.isawaitable(value):
        discard(value)
        raise ConfigurationError(refusal)
    return value


def discard(awaitable: Any) -> None:
    """Close a coroutine that will never be awaited."""
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()
