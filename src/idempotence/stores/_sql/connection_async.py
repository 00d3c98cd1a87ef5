"""The thin I/O layer: a connection runs one query, a runner feeds an operation's
queries to it.

A store operation (`ops`) is a generator of queries.
[`run_async`][idempotence.stores.sql.run_async] feeds it from a connection until it
returns. Connections wrap a database driver's connection and translate its errors into
the library's ([`StoreError`][idempotence.errors.StoreError] and friends, always
``from`` the driver's exception).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any, Generic, Protocol, TypeVar

from ..._concurrency import AsyncLock
from .ops import Op, Query, Row
from .retry import Blocks

T = TypeVar("T")


class AsyncConnection(Protocol):
    """A database connection, as the stores use it."""

    raw: Any
    """The driver's own connection (``psycopg.AsyncConnection``, ``sqlite3.Connection``),
    for the application's writes inside a phase."""

    async def fetch(self, query: Query) -> list[Row]:
        """Run one statement; return its rows (empty for none)."""

    def atomic(self, first: Op[T] | None = None) -> AbstractAsyncContextManager[T | None]:
        """A write transaction (a savepoint when one is already open).

        ``first`` runs as its first statements and its result is what the block yields;
        an operation handed to [`defer`][idempotence.stores.sql.AsyncConnection.defer]
        inside the block runs as its last statements, just before the commit. A driver
        sends each with the BEGIN or the COMMIT in one trip where it can
        (request-as-transaction, F3, makes no more trips than the bare handler).
        """

    def defer(self, op: Op[Any]) -> None:
        """Run ``op`` when the innermost open
        [`atomic`][idempotence.stores.sql.AsyncConnection.atomic] block commits, as its
        last statements; if it raises, the block rolls back and its exit raises."""

    async def perform(self, op: Op[T], *, atomic: bool, write: bool) -> T:
        """Run a whole operation in a transaction of its own (``atomic``) or committed
        on its own; ``write`` says whether it writes."""

    async def run_in_transaction(self, op: Op[T]) -> T:
        """Run a whole operation inside the transaction open on this connection."""


class AsyncSource(Protocol):
    """Where a store gets its connections: a pool, one connection, a file."""

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection]: ...

    async def close(self) -> None: ...


C = TypeVar("C", bound=AsyncConnection)


class AsyncSingleSource(Generic[C]):
    """An [`AsyncSource`][idempotence.stores.sql.AsyncSource] of one connection, the
    application's: the store's operations take turns on it (one at a time, so a
    transaction of the store's is never interleaved with another operation's
    statements), and closing the store leaves it open.

    Args:
        conn: the store's connection on the application's driver connection.
    """

    def __init__(self, conn: C) -> None:
        self.conn = conn
        # Not re-entrant: an operation inside the store's transaction never asks for
        # the connection again (the store's gate refuses that: StoreInTransaction),
        # and a plain lock is cheaper.
        self._turn = AsyncLock()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[C]:
        async with self._turn:
            yield self.conn

    async def close(self) -> None:
        pass  # the application owns it


class AsyncAutocommitConnection(abc.ABC):
    """The base of an [`AsyncConnection`][idempotence.stores.sql.AsyncConnection] whose
    statements commit themselves outside a transaction (the driver's autocommit, or
    Django's outside an ``atomic()`` block): it supplies ``perform`` and
    ``run_in_transaction``; the subclass supplies ``fetch``, ``atomic`` and ``defer``.
    Inside a transaction the application opened, a statement joins it.
    """

    @abc.abstractmethod
    async def fetch(self, query: Query) -> list[Row]:
        """Run one statement; return its rows (empty for none)."""

    @abc.abstractmethod
    def atomic(self, first: Op[T] | None = None) -> AbstractAsyncContextManager[T | None]:
        """A write transaction, or a savepoint when one is open (see
        [`AsyncConnection.atomic`][idempotence.stores.sql.AsyncConnection.atomic])."""

    async def perform(self, op: Op[T], *, atomic: bool, write: bool) -> T:
        """Run ``op`` in a transaction of its own (``atomic``), or statement by
        statement, each committing itself."""
        async with self.atomic() if atomic else nullcontext():
            return await run_async(op, self)

    async def run_in_transaction(self, op: Op[T]) -> T:
        """Run ``op`` inside the transaction open on this connection."""
        return await run_async(op, self)


class AsyncFetcher(Protocol):
    """What runs an operation's statements: a connection, or a view of one."""

    async def fetch(self, query: Query) -> list[Row]: ...


async def run_async(
    op: Op[T], conn: AsyncFetcher, rows: list[Row] | None = None, query: Query | None = None
) -> T:
    """Run ``op`` to completion on ``conn``; given ``rows``, its first statement
    already ran (sent with others in one round trip) and returned them; given
    ``query`` instead, those rows were sent already, and ``query`` is its next."""
    try:
        if query is None:
            query = next(op) if rows is None else op.send(rows)
        while True:
            query = op.send(await conn.fetch(query))
    except StopIteration as done:
        result: T = done.value
        return result


@asynccontextmanager
async def body_async(
    blocks: Blocks, conn: AsyncConnection, first: Op[T] | None
) -> AsyncIterator[T | None]:
    """The inside of a transaction block that runs its statements one by one: run
    ``first`` and yield its result, then run what was deferred to the commit (see
    [`Blocks`][idempotence.stores.sql.Blocks])."""
    with blocks.block() as deferred:
        yield None if first is None else await run_async(first, conn)
        blocks.seal(deferred)
        while deferred:
            await run_async(deferred.pop(0), conn)
