"""The thin I/O layer: connections that run one query, and the two op runners.

A store operation (:mod:`._ops`) is a generator of queries. :func:`run` feeds it from
a sync connection and :func:`run_async` from an async one; they are the only code
that exists twice, and each is a handful of lines.

Connections wrap a database driver's connection and translate its errors into the
library's (:class:`~idempotence.errors.StoreError` and friends, always ``from`` the
driver's exception).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from typing import Any, Protocol, TypeVar

from ..errors import StoreError
from ._ops import Op, Query, Row

T = TypeVar("T")


class TransientError(StoreError):
    """The database aborted the transaction (serialization failure, deadlock, busy).

    The store retries operations whose transaction it owns; inside a caller's
    transaction the caller decides.
    """


class Connection(Protocol):
    """A sync database connection, as the stores use it."""

    #: The driver's own connection (``psycopg.Connection``, ``sqlite3.Connection``),
    #: for the application's writes inside a phase.
    raw: Any

    def fetch(self, query: Query) -> list[Row]:
        """Run one statement; return its rows (empty for none)."""

    def atomic(self, first: Op[T] | None = None) -> AbstractContextManager[T | None]:
        """A write transaction (a savepoint when one is already open).

        ``first`` runs as its first statements and its result is what the block
        yields; an operation handed to :meth:`defer` inside the block runs as its last
        statements, just before the commit. A driver sends each with the BEGIN or the
        COMMIT in one trip where it can (request-as-transaction, F3, makes no more
        trips than the bare handler).
        """

    def defer(self, op: Op[Any]) -> None:
        """Run ``op`` when the innermost open :meth:`atomic` block commits, as its
        last statements; if it raises, the block rolls back and its exit raises."""

    def unit(self, *, write: bool = True) -> AbstractContextManager[None]:
        """What a self-contained operation needs to be committed on its own."""


class AsyncConnection(Protocol):
    """An async database connection, as the stores use it."""

    raw: Any

    async def fetch(self, query: Query) -> list[Row]: ...

    def atomic(self, first: Op[T] | None = None) -> AbstractAsyncContextManager[T | None]: ...

    def defer(self, op: Op[Any]) -> None: ...

    async def perform(self, op: Op[T], *, atomic: bool, write: bool) -> T:
        """Run a whole operation in a transaction of its own (``atomic``) or in
        autocommit; ``write`` says whether it writes."""

    async def run_in_transaction(self, op: Op[T]) -> T:
        """Run a whole operation inside the transaction open on this connection."""


class Source(Protocol):
    """Where a sync store gets its connections: a pool, one connection, a file."""

    def connection(self) -> AbstractContextManager[Connection]: ...

    def close(self) -> None: ...


class AsyncSource(Protocol):
    def connection(self) -> AbstractAsyncContextManager[AsyncConnection]: ...

    async def close(self) -> None: ...


class Blocks:
    """The operations deferred to the commit of each open transaction block of one
    connection (see :meth:`Connection.defer`), innermost last.

    A driver's ``atomic`` opens and ends the transaction; between the two it runs
    :meth:`body` (or :meth:`body_async`), which runs ``first``, yields its result to
    the block, and runs what was deferred before the driver commits. An exception out
    of it, the block's own or a deferred operation's, is the driver's cue to roll back.
    A driver that sends the deferred statements with its COMMIT keeps only the
    bookkeeping: :meth:`block`, then :meth:`seal` before it runs them.
    """

    def __init__(self) -> None:
        self._open: list[list[Op[Any]]] = []

    def defer(self, op: Op[Any]) -> None:
        if not self._open:
            op.close()
            raise RuntimeError("defer() needs an open transaction block")
        self._open[-1].append(op)

    @contextmanager
    def block(self) -> Iterator[list[Op[Any]]]:
        """Open a block; the list collects what is deferred to its commit. Whatever
        is still in it when the block ends (it failed, or never ran them) is closed."""
        deferred: list[Op[Any]] = []
        self._open.append(deferred)
        try:
            yield deferred
        finally:
            # The block failed (or is done): what it deferred never runs.
            if self._open and self._open[-1] is deferred:
                self._open.pop()
            for op in deferred:
                op.close()

    def seal(self, deferred: list[Op[Any]]) -> None:
        """Nothing more is deferred to this block: its commit is under way."""
        if not self._open or self._open[-1] is not deferred:
            raise RuntimeError("transaction blocks must end innermost first")
        self._open.pop()

    @contextmanager
    def body(self, conn: Connection, first: Op[T] | None) -> Iterator[T | None]:
        with self.block() as deferred:
            yield None if first is None else run(first, conn)
            self.seal(deferred)
            while deferred:
                run(deferred.pop(0), conn)

    @asynccontextmanager
    async def body_async(
        self, conn: AsyncConnection, first: Op[T] | None
    ) -> AsyncIterator[T | None]:
        with self.block() as deferred:
            yield None if first is None else await run_async(first, conn)
            self.seal(deferred)
            while deferred:
                await run_async(deferred.pop(0), conn)


def perform(conn: Connection, op: Op[T], *, atomic: bool, write: bool) -> T:
    """Run a whole operation on ``conn`` in a transaction of its own, or autocommit."""
    with conn.atomic() if atomic else conn.unit(write=write):
        return run(op, conn)


def run(op: Op[T], conn: Connection, rows: list[Row] | None = None) -> T:
    """Run ``op`` to completion on a sync connection; given ``rows``, its first
    statement already ran (sent with others in one round trip) and returned them."""
    try:
        query = next(op) if rows is None else op.send(rows)
        while True:
            query = op.send(conn.fetch(query))
    except StopIteration as done:
        result: T = done.value
        return result


async def run_async(op: Op[T], conn: AsyncConnection, rows: list[Row] | None = None) -> T:
    """Run ``op`` to completion on an async connection (``rows`` as for :func:`run`)."""
    try:
        query = next(op) if rows is None else op.send(rows)
        while True:
            query = op.send(await conn.fetch(query))
    except StopIteration as done:
        result: T = done.value
        return result
