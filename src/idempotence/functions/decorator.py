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
from ._arguments import Selector
from ._driver import call
from ._driver_async import call_async
from ._guard import Guard

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
    serializer: tuple[Callable[[Any], Any], Callable[[Any], Any]] | None = None,
    final_exceptions: Iterable[type[BaseException]] = (),
    wait: timedelta | None = None,
    lock_timeout: timedelta = DEFAULT_HANDLER_LOCK_TIMEOUT,
    heartbeat: timedelta | None = None,
    retention: timedelta | None = DEFAULT_RETENTION,
    transactional: bool = False,
) -> Callable[[F], F]:
    """Guard a function (``def`` or ``async def``) so that each key runs it once.

    The first call with a key runs the function and stores what it returned; every
    later call with that key returns the stored value, restored to the declared return
    type, without running the function. A call racing one that runs is refused (or, with
    ``wait``, waits for it); a call with the same key but other arguments is refused.

    Args:
        store: The key store, or a function without arguments that returns it (opened
            at the first call: a worker process opens its own). A sync store
            (``SqliteStore``, ``PostgresStore``, ``RedisStore``...) guards a ``def``, an
            async one an ``async def``.
        key: Where the key comes from: an argument's name (``"order_id"``), a dotted
            path into an argument (``"order.id"``: attributes, or mapping items), or a
            callable given the call's arguments. A str, int or UUID, 1 to 255
            printable ASCII characters.
        scope: Who owns the key, chosen like ``key`` (a tenant's id, say); default:
            ``name``, so two functions never share keys.
        name: The function's name in the store (its scope by default, its metrics and
            traces, and part of its fingerprint); default: its qualified name,
            ``module.function``. Give one to keep keys valid across a rename.
        fingerprint_exclude: Arguments (or dotted paths into them) left out of the
            fingerprint: a timestamp regenerated on each retry, a database session.
            ``self`` and ``cls`` always are.
        serializer: ``(dump, load)``: ``dump(value)`` returns a JSON value, ``load``
            makes the value from it again. Default: by the declared return type (JSON
            values, dataclasses, pydantic models).
        final_exceptions: Exceptions that are the call's answer: stored, and raised
            again (rebuilt from their class and arguments) on every replay. Any other
            exception releases the key, so a retry runs the function again.
        wait: Wait up to this long (at most 5 minutes) for a racing call with the same
            key to finish, then return its result, instead of raising
            :class:`~idempotence.errors.CallInProgress` at once.
        lock_timeout: How long a silent call keeps the key: after a crash, a retry
            takes it over this long after the last heartbeat.
        heartbeat: How often a running call extends its lock; default a third of
            ``lock_timeout``. So a call may run for as long as it needs.
        retention: How long a finished key replays; None keeps it forever.
        transactional: Run the function inside the claim's transaction (a SQL store
            only): its writes, through ``current_call().tx``, commit together with the
            stored result, or roll back together with the claim.

    Returns:
        The decorator. The guarded function keeps the signature of the original.

    Raises:
        ConfigurationError: At decoration: a ``key``, ``scope`` or
            ``fingerprint_exclude`` that names no parameter, a return type that cannot
            be stored without a serializer, a sync store on an ``async def`` (or the
            reverse), ``transactional=True`` on a store without transactions.

    The guarded function raises, besides its own exceptions:
    :class:`~idempotence.errors.ArgumentsMismatch` (the key was used with other
    arguments), :class:`~idempotence.errors.CallInProgress` (a call with the key is
    running; ``retry_after`` says for how long at most),
    :class:`~idempotence.errors.ResultNotStorable` (the function ran but its result
    cannot be stored), :class:`~idempotence.errors.MissingKey` and
    :class:`~idempotence.errors.InvalidKey` (no usable key), and
    :class:`~idempotence.errors.StoreUnavailable` (the store cannot be reached: the
    function did not run).

    Example:
        ```python
        from idempotence import SqliteStore, idempotent

        store = SqliteStore("keys.sqlite3")
        store.migrate()

        @idempotent(store, key="order_id")
        def charge(order_id: str, amount: int) -> dict:
            return {"charged": amount}

        charge("order-1", 500)   # runs
        charge("order-1", 500)   # returns the stored {"charged": 500}
        ```
    """

    def decorate(fn: F) -> F:
        guard = Guard(
            fn,
            key=key,
            scope=scope,
            name=name,
            fingerprint_exclude=fingerprint_exclude,
            serializer=serializer,
            final_exceptions=final_exceptions,
            wait=wait,
            lock_timeout=lock_timeout,
            heartbeat=heartbeat,
            retention=retention,
            transactional=transactional,
        )
        is_async = inspect.iscoroutinefunction(fn)
        resolve = _resolver(store, guard, is_async)
        if is_async:

            @functools.wraps(fn)
            async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                return await call_async(guard, resolve(), args, kwargs)

            wrapper: Any = guarded_async
        else:

            @functools.wraps(fn)
            def guarded(*args: Any, **kwargs: Any) -> Any:
                return call(guard, resolve(), args, kwargs)

            wrapper = guarded
        wrapper.__idempotence_guard__ = guard
        result: F = wrapper
        return result

    return decorate


def _resolver(store: Any, guard: Guard, is_async: bool) -> Callable[[], Any]:
    """The store, checked now, or its opener, called (and the store checked) at the
    first call only."""
    if callable(getattr(store, "claim", None)) or not callable(store):
        guard.check_store(store, is_async)
        return lambda: store
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
