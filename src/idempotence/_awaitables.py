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

_NEVER_AWAITABLE = frozenset({type(None), str, bytes, int, float, bool, dict, list, tuple})
"""What a scope callable or a guarded function mostly returns: no need to ask inspect."""


async def settle_async(value: Any, refusal: str) -> Any:
    """``value``, awaited if it is awaitable."""
    if type(value) in _NEVER_AWAITABLE:
        return value
    return await value if inspect.isawaitable(value) else value


def settle(value: Any, refusal: str) -> Any:
    """``value``; an awaitable is refused with ``ConfigurationError(refusal)``."""
    if type(value) in _NEVER_AWAITABLE:
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
