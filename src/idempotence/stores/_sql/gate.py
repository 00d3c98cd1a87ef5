"""The one gate every SQL store's own connections go through, sync and async alike.

Three rules, the same on every store and every source:

* Inside a store's open transaction, the same thread or task must not ask the store
  for a connection of its own (an operation without ``tx=``, a second
  ``transaction()``). Depending on the source that would wait forever for the very
  transaction that waits for it (SQLite's one writer, a single-connection source's
  one slot, a PostgreSQL row lock), or quietly run inside it: so it raises
  [`StoreInTransaction`][idempotence.errors.StoreInTransaction] at once, everywhere.
* After ``close()`` the store takes no connection at all, even from an application's
  pool or connection that stays open: [`StoreUnavailable`][idempotence.errors.StoreUnavailable].
* A transaction object is usable inside its block only. When the block ends, the
  store swaps the transaction's connection for `ENDED`, which refuses every use
  (a statement, ``tx.connection``, ``tx=`` on any operation: they all go through it)
  with [`TransactionEnded`][idempotence.errors.TransactionEnded], before anything is sent: the
  connection is the source's again, maybe already in another request's transaction.

"The same thread or task" is a `contextvars.ContextVar`: each thread has a
context of its own, each asyncio task a copy of its creator's. So a task created
inside the transaction counts as inside it (awaiting it there could deadlock just the
same), and a thread started inside it does not (it waits its turn like any other).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, NoReturn

from ...errors import StoreInTransaction, StoreUnavailable, TransactionEnded

_OPEN: ContextVar[frozenset[Gate]] = ContextVar(
    "idempotence_open_transactions", default=frozenset()
)
"""The gates of the stores that have a transaction open in the current context."""

_NESTED_OPERATION = (
    "A store operation without tx= (claim, finish, release, heartbeat, forget, get, "
    "migrate) was called while this store's transaction is open in the same "
    "thread or task: it would need a connection of its own and could wait forever for "
    "that transaction. Pass tx= (claim, finish) to run it in the transaction, "
    "or call it after the transaction ends."
)
_NESTED_TRANSACTION = (
    "store.transaction() was opened while this store's transaction is open in the same "
    "thread or task: it would need a connection of its own and could wait forever for "
    "the first. Run the statements in the open transaction (tx.execute, tx= on the "
    "store's operations), or open the second after the first ends."
)
_CLOSED = "This store is closed (close() is final): open a new store to use the database."
_ENDED = (
    "This transaction's block has ended (it committed or rolled back): use the "
    "transaction, its statements and tx= on the store's operations, inside its `with` "
    "block only, and open a new store.transaction() for later writes."
)


class Gate:
    """A store's way to connections of its own: refused while the store has a
    transaction open in this context, and for good after `close`."""

    def __init__(self) -> None:
        self._closed = False
        # The block holds nothing but its gate: one for every transaction.
        self._marked = _Marked(self)

    def check(self) -> None:
        """Raise unless an operation may take a connection of its own now."""
        if self._closed:
            raise StoreUnavailable(_CLOSED)
        if self in _OPEN.get():
            raise StoreInTransaction(_NESTED_OPERATION)

    def transaction(self) -> _Marked:
        """Mark the store's transaction open in this context while the block runs
        (``with`` or ``async with``, beside the connection's)."""
        return self._marked

    def close(self) -> None:
        self._closed = True


class _Marked:
    """The block of `Gate.transaction`. A class, not a generator: it is entered
    for every transaction."""

    __slots__ = ("_gate",)

    def __init__(self, gate: Gate) -> None:
        self._gate = gate

    def __enter__(self) -> None:
        gate = self._gate
        opened = _OPEN.get()
        if gate in opened:
            raise StoreInTransaction(_NESTED_TRANSACTION)
        if gate._closed:  # the rest of gate.check(), whose other test just passed
            raise StoreUnavailable(_CLOSED)
        _OPEN.set(opened | {gate})

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        # Not ContextVar.reset(): transactions of two stores may end out of order
        # (the HTTP drivers enter and exit them by hand), and an async block may
        # be exited from another task's context, where a token is refused.
        _OPEN.set(_OPEN.get() - {self._gate})

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        self.__exit__(kind, exc, tb)


class _Ended:
    """The connection of every transaction whose block has ended.

    Swapping it in is the whole cost of the rule, paid once at the block's exit:
    every use of a transaction's connection already looks an attribute up on it, so
    no use needs a check of its own, and none can forget one."""

    __slots__ = ()

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__"):
            # Introspection (copy, pickle, a debugger) asks for optional dunders and
            # expects AttributeError when there is none.
            raise AttributeError(name)
        refuse_ended()


ENDED: Any = _Ended()
"""Stands in for the connection of a transaction whose block has ended."""


def refuse_ended() -> NoReturn:
    """Raise [`TransactionEnded`][idempotence.errors.TransactionEnded]: a transaction was used
    after its block."""
    raise TransactionEnded(_ENDED)
