"""A sync face on an async store, so that one test body drives either flavour.

An async store is driven through `Blocking`, which runs its coroutines on a
private event loop in a background thread (`EventLoopThread`). All the calls
one thread makes through a face run in one context of that thread's own, as the
awaits of one task would: a transaction opened through the face is open for the
thread's next calls (a store refuses to nest its transactions).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from ..stores.capabilities import Capability, capabilities_of

__all__ = ["Blocking", "BlockingTransaction", "EventLoopThread"]

T = TypeVar("T")


class EventLoopThread:
    """An event loop running in a daemon thread; `run` blocks on a coroutine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], context: contextvars.Context | None = None) -> T:
        """Run ``coro`` to its end; in ``context`` when given (else a copy of the
        caller's, as for any new task)."""
        if context is not None:
            coro = _in_context(coro, context)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def close(self) -> None:
        """Stop the loop and its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


async def _in_context(coro: Coroutine[Any, Any, T], context: contextvars.Context) -> T:
    return await asyncio.create_task(coro, context=context)


class _ThreadContexts(threading.local):
    """One context per thread, as one task keeps one through all its awaits."""

    def __init__(self) -> None:
        self.context = contextvars.Context()


class BlockingTransaction:
    """A sync face on an async store's transaction."""

    def __init__(self, tx: Any, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._tx = tx
        self._run = run
        self.claim = tx.claim

    @property
    def connection(self) -> Any:
        # Read at each use, as on the store's own transaction: one kept past its
        # block refuses it.
        return self._tx.connection

    def execute(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        """Run ``sql`` in the transaction; return its rows."""
        result: list[dict[str, Any]] = self._run(self._tx.execute(sql, params))
        return result


class Blocking:
    """A sync face on an async store: same methods, same results."""

    def __init__(self, store: Any, loop: EventLoopThread) -> None:
        self.store = store
        self._loop = loop
        self._contexts = _ThreadContexts()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro, self._contexts.context)

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What the store behind the face declares."""
        return capabilities_of(self.store)

    def claim(self, request: Any, *, tx: BlockingTransaction | None = None) -> Any:
        if tx is not None:
            return self._run(self.store.claim(request, tx=tx._tx))
        return self._run(self.store.claim(request))

    def checkpoint(
        self, tx: BlockingTransaction, lease: Any, recovery_point: str, *, calling: Any = None
    ) -> Any:
        return self._run(self.store.checkpoint(tx._tx, lease, recovery_point, calling=calling))

    def finish(
        self,
        lease: Any,
        response: Any,
        *,
        tx: Any = None,
        error: Any = None,
        at_commit: bool = False,
    ) -> None:
        # A key store (Redis) takes no transaction: pass what it knows only.
        shared: dict[str, Any] = {}
        if tx is not None or at_commit:
            shared = {"tx": None if tx is None else tx._tx, "at_commit": at_commit}
        self._run(self.store.finish(lease, response, error=error, **shared))

    def end_phase(self, tx: BlockingTransaction, lease: Any, **closing: Any) -> Any:
        return self._run(self.store.end_phase(tx._tx, lease, **closing))

    def release(self, lease: Any) -> None:
        self._run(self.store.release(lease))

    def heartbeat(self, lease: Any) -> Any:
        return self._run(self.store.heartbeat(lease))

    def get(self, scope: str, key: str) -> Any:
        return self._run(self.store.get(scope, key))

    def key_status(self, scope: str, key: str) -> Any:
        return self._run(self.store.key_status(scope, key))

    def forget(self, lease: Any) -> None:
        self._run(self.store.forget(lease))

    def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        self._run(self.store.wait_for_settle(scope, key, seconds))

    def migrate(self) -> list[str]:
        result: list[str] = self._run(self.store.migrate())
        return result

    def close(self) -> None:
        self._run(self.store.close())

    @contextmanager
    def transaction(self, *, claim: Any = None, **kw: Any) -> Iterator[BlockingTransaction]:
        cm = self.store.transaction(claim=claim, **kw)
        tx = self._run(cm.__aenter__())
        try:
            yield BlockingTransaction(tx, self._run)
        except BaseException as exc:
            if not self._run(cm.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self._run(cm.__aexit__(None, None, None))
