"""``@idempotent``: guard any function by a key taken from its arguments (DESIGN 12)."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, TypeVar

from ..states import DEFAULT_HANDLER_LOCK_TIMEOUT, DEFAULT_RETENTION
from ..stores import AsyncKeyStore, KeyStore
from ._driver import call
from ._driver_async import call_async
from ._guard import Guard
from ._options import Options, Selector, Serializer

__all__ = ["idempotent"]

F = TypeVar("F", bound=Callable[..., Any])
StoreOrOpener = KeyStore | AsyncKeyStore | Callable[[], KeyStore | AsyncKeyStore]


def idempotent(
    store: StoreOrOpener,
    *,
    key: Selector,
    scope: Selector | None = None,
    name: str | None = None,
    fingerprint_exclude: Iterable[str] = (),
    serializer: Serializer | None = None,
    final_exceptions: Iterable[type[BaseException]] = (),
    wait: timedelta | None = None,
    lock_timeout: timedelta = DEFAULT_HANDLER_LOCK_TIMEOUT,
    heartbeat: timedelta | None = None,
    retention: timedelta | None = DEFAULT_RETENTION,
    transactional: bool = False,
    fingerprint_secret: str | bytes | None = None,
    previous_fingerprint_secret: str | bytes | None = None,
) -> Callable[[F], F]:
    """Guard a function (``def`` or ``async def``) so that each key runs it once.

    The first call with a key runs the function and stores what it returned; a later
    call with the key returns the stored value, restored to the declared return type. A
    racing call raises [`CallInProgress`][idempotence.errors.CallInProgress] (or
    waits, with ``wait``); the key with other arguments raises
    [`ArgumentsMismatch`][idempotence.errors.ArgumentsMismatch]; an unreachable store
    raises [`StoreUnavailable`][idempotence.errors.StoreUnavailable]. The
    function runs in none of these.

    Args:
        store: The key store, or a function without arguments that returns it (called
            at the first call). A sync store guards a ``def``, an async one an
            ``async def``.
        key: An argument's name (``"order_id"``), a dotted path into an argument
            (``"order.id"``: attributes or mapping items), or a callable given the
            call's arguments. A str, int or UUID of 1 to 255 printable ASCII characters.
        scope: Who owns the key, chosen like ``key``; default: ``name``.
        name: The function's name in the store, metrics and fingerprint; default: its
            qualified name, ``module.function``.
        fingerprint_exclude: Arguments (or dotted paths into them) left out of the
            fingerprint. ``self`` and ``cls`` always are.
        serializer: ``(dump, load)``: to a JSON value and back. Default: by the
            declared return type (JSON values, dataclasses, pydantic models).
        final_exceptions: Exceptions stored and raised again on every replay; any
            other releases the key, so a retry runs the function again.
        wait: Wait up to this long (at most 5 minutes) for a racing call to finish and
            return its result.
        lock_timeout: How long a silent (crashed) call keeps the key.
        heartbeat: How often a running call extends its lock (default: a third of
            ``lock_timeout``).
        retention: How long a finished key replays; None keeps it forever.
        transactional: Run the function inside the claim's transaction (SQL stores):
            its writes through ``current_call().tx`` commit with the stored result.
        fingerprint_secret: Fingerprint the arguments with HMAC-SHA-256 keyed by it.
        previous_fingerprint_secret: During a rotation, the secret replaced: calls
            stored under it still replay.

    Returns:
        The decorator; the guarded function keeps the original's signature.

    Raises:
        ConfigurationError: At decoration, for what cannot work: a ``key`` naming no
            parameter, a return type that cannot be stored, a store of the other
            flavour, ``transactional=True`` on a store without transactions, a bad secret.

    Example:
        ```python
        @idempotent(store, key="order_id")
        def charge(order_id: str, amount: int) -> dict:
            return {"charged": amount}

        charge("order-1", 500)   # runs
        charge("order-1", 500)   # returns the stored {"charged": 500}
        ```
    """
    # Every keyword argument as given (read first thing, before any local is bound).
    options = Options(**{name: value for name, value in locals().items() if name != "store"})

    def decorate(fn: F) -> F:
        return _guarded(fn, store, Guard(fn, options))

    return decorate


def _guarded(fn: F, store: Any, guard: Guard) -> F:
    is_async = inspect.iscoroutinefunction(fn)
    wrapper: Any
    if callable(getattr(store, "claim", None)) or not callable(store):
        guard.check_store(store, is_async)
        # A store given as it is: each call goes straight to it (no resolver to call).
        if is_async:

            @functools.wraps(fn)
            async def guarded_on_async(*args: Any, **kwargs: Any) -> Any:
                return await call_async(guard, store, args, kwargs)

            wrapper = guarded_on_async
        else:

            @functools.wraps(fn)
            def guarded_on(*args: Any, **kwargs: Any) -> Any:
                return call(guard, store, args, kwargs)

            wrapper = guarded_on
    elif is_async:
        resolve = _opener(store, guard, is_async)

        @functools.wraps(fn)
        async def guarded_async(*args: Any, **kwargs: Any) -> Any:
            return await call_async(guard, resolve(), args, kwargs)

        wrapper = guarded_async
    else:
        resolve = _opener(store, guard, is_async)

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            return call(guard, resolve(), args, kwargs)

        wrapper = guarded
    wrapper.__idempotence_guard__ = guard
    result: F = wrapper
    return result


def _opener(store: Any, guard: Guard, is_async: bool) -> Callable[[], Any]:
    """The store that opener ``store`` returns, called (and the store checked) at the
    first call only."""
    opened: list[Any] = []
    lock = threading.Lock()

    def resolve() -> Any:
        if opened:
            return opened[0]
        with lock:
            if not opened:
                candidate = store()
                guard.check_store(candidate, is_async)
                opened.append(candidate)
        return opened[0]

    return resolve
