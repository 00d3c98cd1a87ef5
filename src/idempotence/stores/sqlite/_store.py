"""The SQLite key store on the standard library, sync and async (the embedded default).

SQLite serialises writers, which makes the claim simple and exactly as safe as on
PostgreSQL on one node: it runs as read-decide-write inside ``BEGIN IMMEDIATE``, and
no other writer can interleave. The database is put in WAL mode so readers never
wait for the writer, and every connection waits (``busy_timeout``) rather than fail
at once when another holds the write lock.

The async store runs the same sync connections, each on a thread of its own: sqlite3
has no async API, and a local file is quick enough that a thread hop is the whole
cost. Its own reads skip even that: they run on the event loop, on a reader
connection that never waits (`_LoopReader`).

At the default durability each commit waits for an fsync, so on a file the store's
own autocommit writes commit in groups: the writes queued while one commit is in
flight go in the next, one savepoint each, answered after the COMMIT
(`_group`, `SqliteConnection.commit_group`; docs/design.md section 8).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import (
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from typing import Any, TypeVar

from ...errors import StoreUnavailable
from ...observability import Instrumentation
from .._sql.connection_async import run_async
from .._sql.ops import Op, Query, Row
from .._sql.retry import TransientError
from .._sql.store import Store
from .._sql.store_async import AsyncStore
from ..capabilities import Capability
from ._group import Groups
from ._store_shared import (
    DEFAULT_BUSY_TIMEOUT,
    MAX_IDLE_CONNECTIONS,
    SqliteConnection,
    SqliteDialect,
    _check_synchronous,
    _fail,
    _ThreadGroups,
    _Write,
    connect,
)

T = TypeVar("T")


class _FileSource:
    """A small pool of connections to one database file."""

    def __init__(self, path: str, *, busy_timeout: float, synchronous: str | None) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._synchronous = synchronous
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._writer = threading.Lock()
        self._groups = _ThreadGroups()
        self._closed = False

    def connection(self) -> _FileCheckout:
        return _FileCheckout(self)

    def checkout(self) -> SqliteConnection:
        with self._lock:
            if self._closed:
                raise StoreUnavailable("the SQLite store is closed")
            raw = self._idle.pop() if self._idle else None
        if raw is None:
            raw = connect(
                self._path, busy_timeout=self._busy_timeout, synchronous=self._synchronous
            )
        # A wrapper per checkout, not per connection: a transaction object kept past its
        # block then holds a wrapper no other operation uses (its defer() refuses).
        return SqliteConnection(raw, self._writer, self._groups)

    def checkin(self, conn: SqliteConnection) -> None:
        if conn.raw.in_transaction:  # an interrupted operation; never reuse it half-done
            conn.raw.rollback()
        with self._lock:
            keep = not self._closed and len(self._idle) < MAX_IDLE_CONNECTIONS
            if keep:
                self._idle.append(conn.raw)
        if not keep:
            conn.raw.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for raw in idle:
            raw.close()


class _FileCheckout:
    """One of the file's connections for one operation. A class, not a generator: it
    is entered for every operation."""

    __slots__ = ("_conn", "_source")

    def __init__(self, source: _FileSource) -> None:
        self._source = source
        self._conn: SqliteConnection | None = None

    def __enter__(self) -> SqliteConnection:
        conn = self._conn = self._source.checkout()
        return conn

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        assert self._conn is not None
        self._source.checkin(self._conn)


class _SingleSource:
    """One connection (the application's, or an in-memory database); turns are taken."""

    def __init__(self, raw: sqlite3.Connection, *, owned: bool) -> None:
        self._conn = SqliteConnection(raw)
        # Not re-entrant, like the PostgreSQL single source: a thread inside
        # store.transaction() never asks for it again, the store's gate refuses that
        # (StoreInTransaction, see _sql/gate.py), and a plain lock is cheaper.
        self._lock = threading.Lock()
        self._owned = owned

    @contextmanager
    def connection(self) -> Iterator[SqliteConnection]:
        with self._lock:
            yield self._conn

    def close(self) -> None:
        if self._owned:
            self._conn.raw.close()


def _source(
    target: str | sqlite3.Connection, busy_timeout: float, synchronous: str | None
) -> _FileSource | _SingleSource:
    _check_synchronous(target, synchronous)
    if isinstance(target, sqlite3.Connection):
        return _SingleSource(target, owned=False)
    if target == ":memory:":
        # Every connection to ":memory:" is a different database: share one.
        raw = connect(target, busy_timeout=busy_timeout, synchronous=synchronous)
        return _SingleSource(raw, owned=True)
    return _FileSource(target, busy_timeout=busy_timeout, synchronous=synchronous)


class SqliteStore(Store):
    """The SQLite key store (sync). ``target`` is a file path, ``":memory:"``, or a
    ``sqlite3.Connection`` the application already has.

    ``synchronous`` sets ``PRAGMA synchronous`` on the store's own connections (one of
    `SYNCHRONOUS`; ``None`` keeps SQLite's default, FULL): ``"NORMAL"`` skips
    the fsync per commit, so the last commits before a power loss may be lost, never
    torn (see ``benchmarks/http_bench.py`` for what it buys).

    ```python
    store = SqliteStore("keys.sqlite3")
    ```
    """

    capabilities = frozenset({Capability.TRANSACTIONS, Capability.WAITING})
    """A SQL store; SQLite sends no notifications, so a waiting twin polls (P10)."""

    def __init__(
        self,
        target: str | sqlite3.Connection,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        synchronous: str | None = None,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        super().__init__(
            _source(target, busy_timeout, synchronous),
            SqliteDialect(),
            instrumentation=instrumentation,
        )


# -- async: each connection on a thread of its own ---------------------------------------


class _ThreadedConnection:
    """A sqlite3 connection confined to one thread of its own.

    Every call on the connection runs on that thread, in order. A shared thread pool
    would be wrong: a task holding the write lock could wait for a thread while every
    thread waits (busy_timeout) for that lock.
    """

    def __init__(
        self,
        raw: sqlite3.Connection,
        executor: ThreadPoolExecutor,
        writer: asyncio.Lock,
        shared: _Shared | None = None,
    ) -> None:
        self.raw = raw
        self._conn = SqliteConnection(raw)
        self._executor = executor
        self._writer = writer
        self._shared = shared

    @classmethod
    async def open(
        cls,
        opener: Callable[[], sqlite3.Connection],
        writer: asyncio.Lock,
        shared: _Shared | None = None,
    ) -> _ThreadedConnection:
        executor = ThreadPoolExecutor(1, thread_name_prefix="idempotence-sqlite")
        raw = await asyncio.get_running_loop().run_in_executor(executor, opener)
        return cls(raw, executor, writer, shared)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        # In the caller's context, as asyncio.to_thread runs it: an operation reports
        # to the current trace span (a refused fenced write, for one).
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def fetch(self, query: Query) -> list[Row]:
        return await self._call(self._conn.fetch, query)

    @asynccontextmanager
    async def atomic(self, first: Op[T] | None = None) -> AsyncIterator[T | None]:
        # Tasks queue for the one writer here, on the event loop, rather than in
        # SQLite's busy handler on their threads (see SqliteConnection). The BEGIN and
        # ``first`` make one trip to the thread, and the deferred operations and the
        # COMMIT another: the write lock is held for no trip more than the bare
        # transaction needs.
        if self.raw.in_transaction:
            async with self._on_thread(self._conn.atomic(first)) as result:
                yield result
        else:
            async with self._writer, self._on_thread(self._conn.atomic(first)) as result:
                yield result

    def defer(self, op: Op[Any]) -> None:
        self._conn.defer(op)

    async def perform(self, op: Op[T], *, atomic: bool, write: bool) -> T:
        # The whole operation in one trip to the connection's thread: each trip costs
        # about 0.1 ms, as much as the statements themselves.
        if self._shared is not None and not self.raw.in_transaction:
            if atomic or write:
                return await self._shared.groups.write(op, atomic=atomic)
            return await self._shared.reader.read(op, self)
        whole = functools.partial(self._conn.perform, op, atomic=atomic, write=write)
        if (atomic or write) and not self.raw.in_transaction:
            async with self._writer:
                return await self._call(whole)
        return await self._call(whole)

    async def run_in_transaction(self, op: Op[T]) -> T:
        # One trip too: a request-as-transaction holds SQLite's one write lock across
        # its statements, so every trip saved there is time every other writer waits.
        return await self._call(self._conn.run_in_transaction, op)

    @asynccontextmanager
    async def _on_thread(self, cm: AbstractContextManager[T]) -> AsyncIterator[T]:
        entered = await self._call(cm.__enter__)
        try:
            yield entered
        except BaseException as exc:
            if not await self._call(cm.__exit__, type(exc), exc, exc.__traceback__):
                raise
        else:
            await self._call(cm.__exit__, None, None, None)

    async def reset(self) -> None:
        """Roll back what an interrupted operation left; never reuse it half-done."""
        await self._call(self.raw.rollback)

    async def close(self, *, close_raw: bool) -> None:
        if close_raw:
            await self._call(self.raw.close)
        self._executor.shutdown(wait=False)


class _TaskWrite(_Write[T]):
    __slots__ = ("future",)

    def __init__(self, op: Op[T], *, atomic: bool) -> None:
        super().__init__(op, atomic=atomic)
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class _TaskGroups:
    """Group commit for tasks: one committer task at a time commits, on a connection
    (and thread) of its own, every write queued while the previous commit was in
    flight; each writing task awaits its own outcome. The committer starts when a
    write arrives while none is in flight and ends when the queue is empty."""

    def __init__(self, opener: Callable[[], sqlite3.Connection], writer: asyncio.Lock) -> None:
        self._opener = opener
        self._writer = writer
        self._groups: Groups[_TaskWrite[Any]] = Groups()
        self._conn: _ThreadedConnection | None = None
        self._committer: asyncio.Task[None] | None = None
        self._closed = False

    async def write(self, op: Op[T], *, atomic: bool) -> T:
        write = _TaskWrite(op, atomic=atomic)
        if self._groups.arrive(write):
            # In an empty context: it commits every writer's write, not only this
            # one's (each write runs in its own caller's context, see _Write).
            self._committer = asyncio.get_running_loop().create_task(
                self._commit(), context=contextvars.Context()
            )
        # A caller cancelled here is not waited for; a write not yet taken is dropped,
        # one in flight commits or not (as a write whose thread already runs it).
        await write.future
        return write.outcome()

    async def _commit(self) -> None:
        try:
            while True:
                group = self._groups.take()
                for dropped in [write for write in group if write.future.cancelled()]:
                    dropped.op.close()
                    group.remove(dropped)
                try:
                    if group:
                        conn = await self._connection()
                        async with self._writer:
                            await _to_the_end(conn._call(conn._conn.commit_group, group))
                except Exception as exc:
                    _fail(group, exc)
                finally:
                    _wake(group)
                if self._groups.done() is None:
                    return
        except BaseException:
            # Cancelled (the loop is closing): the writes still queued never commit,
            # and nobody is left waiting for them.
            while self._groups.done() is not None:
                _wake(self._groups.take())
            raise
        finally:
            if self._closed:
                await self._close_connection()

    async def _connection(self) -> _ThreadedConnection:
        if self._conn is None:
            self._conn = await _ThreadedConnection.open(self._opener, self._writer)
        return self._conn

    async def close(self) -> None:
        """Close the committer's connection now, or when the commit in flight ends."""
        self._closed = True
        if self._committer is None or self._committer.done():
            await self._close_connection()

    async def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close(close_raw=True)


async def _to_the_end(call: Awaitable[T]) -> T:
    """Await ``call``, a trip to a connection's thread, until the thread is done with
    it, even when cancelled meanwhile (the cancellation is raised then). Cancelling
    the await does not stop the thread: a group it commits has its writes' results
    before its COMMIT has run, and none may be told before the COMMIT returned."""
    future = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([future])
        if not future.cancelled():
            future.exception()  # retrieved: the writes carry what it decided
        raise


def _wake(group: list[_TaskWrite[Any]]) -> None:
    for write in group:
        if not write.future.done():
            write.future.set_result(None)


class _LoopReader:
    """A connection that reads on the event loop's own thread, without the trip to a
    connection's thread (about 0.1 ms, more than a replay's whole read).

    In WAL mode a read never waits for the writer, and the store's reads are a row or
    two by key. It never waits at all: its busy timeout is zero, and a statement that
    finds the database busy (another connection recovering the WAL) runs on the
    caller's connection's thread instead, where waiting blocks nobody else.
    """

    def __init__(self, opener: Callable[[], sqlite3.Connection]) -> None:
        self._opener = opener
        self._conn: SqliteConnection | None = None
        self._closed = False

    async def read(self, op: Op[T], conn: _ThreadedConnection) -> T:
        reader = self._conn if self._conn is not None else await self._open()
        if reader is None:  # closed meanwhile: the caller's own connection reads
            return await conn._call(
                functools.partial(conn._conn.perform_alone, op, atomic=False, write=False)
            )
        return await run_async(op, _ReadOnLoop(reader, conn))

    async def _open(self) -> SqliteConnection | None:
        raw = await asyncio.to_thread(self._opener)
        if self._closed or self._conn is not None:  # closed, or opened by another task
            raw.close()
            return self._conn
        raw.execute("PRAGMA busy_timeout = 0")
        self._conn = SqliteConnection(raw)
        return self._conn

    def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.raw.close()


class _ReadOnLoop:
    def __init__(self, reader: SqliteConnection, conn: _ThreadedConnection) -> None:
        self._reader = reader
        self._conn = conn

    async def fetch(self, query: Query) -> list[Row]:
        try:
            return self._reader.fetch(query)
        except TransientError:
            return await self._conn.fetch(query)


class _Shared:
    """What the connections to one file share: the committer of the store's own
    writes, and the reader on the event loop."""

    def __init__(self, opener: Callable[[], sqlite3.Connection], writer: asyncio.Lock) -> None:
        self.groups = _TaskGroups(opener, writer)
        self.reader = _LoopReader(opener)

    async def close(self) -> None:
        self.reader.close()
        await self.groups.close()


class _AsyncSource:
    """At most ``max_size`` threaded connections; tasks beyond that wait their turn
    without holding a thread. A file's source (``shared``) commits the store's own
    writes in groups and reads on the event loop."""

    def __init__(
        self,
        opener: Callable[[], sqlite3.Connection],
        *,
        max_size: int,
        owned: bool,
        shared: bool = False,
    ) -> None:
        self._opener = opener
        self._slots = asyncio.Semaphore(max_size)
        self._writer = asyncio.Lock()
        self._idle: list[_ThreadedConnection] = []
        self._owned = owned
        self._closed = False
        self._shared = _Shared(opener, self._writer) if shared else None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[_ThreadedConnection]:
        async with self._slots:
            if self._closed:
                raise StoreUnavailable("the SQLite store is closed")
            conn = (
                self._idle.pop()
                if self._idle
                else await _ThreadedConnection.open(self._opener, self._writer, self._shared)
            )
            try:
                yield conn
            finally:
                if conn.raw.in_transaction:  # an interrupted operation
                    await conn.reset()
                if self._closed:  # back after close(): nobody will take it again
                    await conn.close(close_raw=self._owned)
                else:
                    self._idle.append(conn)

    async def close(self) -> None:
        # Idle connections close now, busy ones as they come back (above).
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close(close_raw=self._owned)
        if self._shared is not None:
            await self._shared.close()


class AsyncSqliteStore(AsyncStore):
    """The SQLite key store (async); ``target`` as for
    [`SqliteStore`][idempotence.stores.sqlite.SqliteStore] (an application's connection
    must allow use from other threads: ``check_same_thread=False``).

    On a file it opens up to ``max_size`` connections for the callers, each on a
    thread of its own, plus one that reads on the event loop and one (with its
    thread) that commits the store's own writes in groups.
    """

    capabilities = frozenset({Capability.TRANSACTIONS, Capability.WAITING})
    """A SQL store; SQLite sends no notifications, so a waiting twin polls (P10)."""

    def __init__(
        self,
        target: str | sqlite3.Connection,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        max_size: int = MAX_IDLE_CONNECTIONS,
        synchronous: str | None = None,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        source: _AsyncSource
        _check_synchronous(target, synchronous)
        if isinstance(target, sqlite3.Connection):
            source = _AsyncSource(lambda: target, max_size=1, owned=False)
        else:
            opener = functools.partial(
                connect, target, busy_timeout=busy_timeout, synchronous=synchronous
            )
            # Every connection to ":memory:" is a different database: share one.
            memory = target == ":memory:"
            source = _AsyncSource(
                opener, max_size=1 if memory else max_size, owned=True, shared=not memory
            )
        super().__init__(source, SqliteDialect(), instrumentation=instrumentation)
