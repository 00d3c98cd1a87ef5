"""The MariaDB key store on aiomysql (async) and PyMySQL (sync, generated from this
module by ``scripts/unasync.py``).

The claim is one write transaction that retries (``claim_in_transaction``, reading
first: ``MariaDBDialect.reads_before_insert``): the key is read with ``FOR UPDATE`` and
decided by the state machine, a new key inserted, and the unique constraint decides a
race for one, whose loser runs its claim again. Every fenced write is
conditional on the lock token (F1). A transaction opened with a claim (F3) bounds the
claim's lock wait, and a racing duplicate is answered from a read instead of waiting
for it (F8). MariaDB has no LISTEN: a duplicate that waits for its twin polls (P10).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext, suppress
from typing import Any, TypeVar

from ...errors import StoreUnavailable, TransientError
from ...observability import Instrumentation
from ..capabilities import Capability
from ..sql import APPLICATION, AsyncStore, Blocks, KeyHeld, Op, Query, Row, migrate, run_async
from . import _steps
from ._store_shared import (
    DEFAULT_CONNECT_TIMEOUT,
    MIGRATION_LOCK_WAIT,
    AsyncSlots,
    DriverError,
    MariaDBDialect,
    Settings,
    acquire_slot_async,
    bind_async,
    bounded,
    closed_while_idle,
    connect_async,
    held,
    idle_socket,
    in_transaction,
    racing,
    translated,
)

T = TypeVar("T")


class _AsyncConnection:
    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._blocks = Blocks()
        self._savepoints = 0

    async def fetch(self, query: Query) -> list[Row]:
        if query.name == APPLICATION or query.name.startswith("migration "):
            # The application's statement, or a migration's, runs as written.
            with translated(query.name):
                return (await self._execute(query.sql, query.params or None))[1] or []
        return await self._steps(query, bound=False)

    async def _steps(self, query: Query, *, bound: bool) -> list[Row]:
        """Run the statements of one of the store's queries (see `_steps`)."""
        params = query.params
        rows: list[Row] = []
        ids: list[int] | None = None
        with translated(query.name):
            try:
                for step in _steps.plan(query.sql):
                    sql = step.sql if ids is None else _steps.with_selected(step.sql, ids)
                    found, result = await self._execute(bounded(sql) if bound else sql, params)
                    if found == 0:
                        return []
                    if step.echo is not None:
                        # The row a fenced write returns is the lease that fenced it.
                        result = [{column: params[name] for column, name in step.echo}]
                    if result is not None:
                        rows = result
                        if rows and "id" in rows[0]:
                            ids = _steps.selected(rows)
            except DriverError as exc:
                if bound and held(exc):
                    raise KeyHeld(str(exc)) from exc
                if racing(query, exc):
                    raise TransientError(
                        f"{query.name}: another transaction won the insert"
                    ) from exc
                raise
        return rows

    async def _execute(self, sql: str, params: Any) -> tuple[int, list[Row] | None]:
        """Run one statement: the rows it found (returned, or matched by a write), and
        its rows if it returns any."""
        async with self.raw.cursor() as cur:
            await cur.execute(*bind_async(self.raw, sql, params))
            if cur.description is None:
                return cur.rowcount, None
            rows = list(await cur.fetchall())
            return len(rows), rows

    @asynccontextmanager
    async def atomic(self, first: Op[T] | None = None) -> AsyncIterator[T | None]:
        nested = in_transaction(self.raw)
        if nested:
            self._savepoints += 1
            name = f"idempotence_{self._savepoints}"
            begin, commit, rollback = (
                f"SAVEPOINT {name}",
                f"RELEASE SAVEPOINT {name}",
                f"ROLLBACK TO SAVEPOINT {name}",
            )
        else:
            begin, commit, rollback = "BEGIN", "COMMIT", "ROLLBACK"
        with translated():
            await self._execute(begin, None)
        with self._blocks.block() as deferred:
            try:
                result = None
                if first is not None:
                    # A claim that opens the transaction (F3) bounds its lock waits
                    # (F8): the held key is answered from a read (KeyHeld).
                    result = await run_async(first, self if nested else _Bounded(self))
                yield result
                self._blocks.seal(deferred)
                while deferred:
                    await run_async(deferred.pop(0), self)
            except BaseException:
                # A connection too broken to roll back is the pool's to discard; the
                # error that got us here is the one to report.
                with suppress(DriverError):
                    if nested or in_transaction(self.raw):
                        await self._execute(rollback, None)
                raise
        with translated():
            await self._execute(commit, None)

    def defer(self, op: Op[Any]) -> None:
        self._blocks.defer(op)

    async def perform(self, op: Op[T], *, atomic: bool, write: bool) -> T:
        async with self.atomic() if atomic else nullcontext():
            return await run_async(op, self)

    async def run_in_transaction(self, op: Op[T]) -> T:
        return await run_async(op, self)


class _Bounded:
    """The connection as the claim that opens a transaction sees it: each of its
    statements waits for a row lock at most ``CLAIM_LOCK_WAIT`` (F8)."""

    def __init__(self, conn: _AsyncConnection) -> None:
        self._conn = conn

    async def fetch(self, query: Query) -> list[Row]:
        return await self._conn._steps(query, bound=True)


class _AsyncPoolSource:
    """The store's own connections: opened when needed, up to ``max_size``, kept for
    reuse while they are healthy."""

    def __init__(self, settings: Settings, max_size: int) -> None:
        self._settings = settings
        self._slots = AsyncSlots(max_size)
        self._idle: list[Any] = []
        self._closed = False

    def connection(self) -> _AsyncCheckout:
        return _AsyncCheckout(self)

    async def checkout(self) -> Any:
        if self._closed:
            raise StoreUnavailable("the MariaDB store is closed")
        if not await acquire_slot_async(self._slots, self._settings.connect_timeout):
            raise StoreUnavailable(
                f"no MariaDB connection free within {self._settings.connect_timeout:g} s "
                "(every one of the store's connections is in use)"
            )
        try:
            while True:
                try:
                    # pop() alone, never a test first: threads (sync) share the list.
                    raw = self._idle.pop()
                except IndexError:
                    break
                sock = idle_socket(raw)
                # An idle connection is sent nothing unless the server closed it (a
                # restart, its wait_timeout): one system call tells, no round trip.
                if sock is not None and not closed_while_idle(sock):
                    return raw
                raw.close()
            return await connect_async(self._settings)
        except BaseException:
            self._slots.release()
            raise

    def checkin(self, raw: Any, healthy: bool) -> None:
        try:
            if healthy and not self._closed:
                self._idle.append(raw)
            else:
                raw.close()
        finally:
            self._slots.release()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for raw in idle:
            raw.close()


class _AsyncCheckout:
    """One of the source's connections for one operation; a transaction left open
    commits, or rolls back after an error, before the connection goes back."""

    __slots__ = ("_raw", "_source")

    def __init__(self, source: _AsyncPoolSource) -> None:
        self._source = source
        self._raw: Any = None

    async def __aenter__(self) -> _AsyncConnection:
        self._raw = await self._source.checkout()
        return _AsyncConnection(self._raw)

    async def __aexit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        raw = self._raw
        healthy = not isinstance(exc, StoreUnavailable) and idle_socket(raw) is not None
        try:
            if healthy and in_transaction(raw):
                if exc is None:
                    await raw.commit()
                else:
                    await raw.rollback()
        except DriverError:
            healthy = False
        finally:
            self._source.checkin(raw, healthy)


class _AsyncSingleSource:
    """The application's one connection; operations take turns on it."""

    def __init__(self, raw: Any) -> None:
        self._conn = _AsyncConnection(raw)
        self._turn = AsyncSlots(1)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[_AsyncConnection]:
        async with self._turn:
            yield self._conn

    async def close(self) -> None:
        pass  # the application owns it


class AsyncMariaDBStore(AsyncStore):
    """The MariaDB key store (MariaDB 10.6 or later).

    Args:
        target: a ``mariadb://USER:PASSWORD@HOST:PORT/DATABASE`` URL (``mysql://`` is
            read the same way), and the store opens and owns its connections; or a
            connection of the application's (``aiomysql.Connection`` here,
            ``pymysql.Connection`` for `MariaDBStore`) opened with
            ``autocommit=True``, ``client_flag=CLIENT.FOUND_ROWS`` and
            ``cursorclass=DictCursor``, which the store's operations then share.
        max_size: the most connections the store opens.
        connect_timeout: seconds to wait for a connection (P11: then 503).
        instrumentation: told of every claim and refused fenced write.

    Raises:
        ConfigurationError: a URL that is not a MariaDB URL, or names no database.

    Example:
        ```python
        store = AsyncMariaDBStore("mariadb://app:secret@db:3306/app")
        await store.migrate()
        claim = await store.claim(ClaimRequest(scope="acct_1", key="k1", fingerprint=fp))
        ```
    """

    capabilities = frozenset({Capability.TRANSACTIONS, Capability.WAITING})
    """A SQL store; MariaDB has no LISTEN, so a waiting twin polls (P10)."""

    def __init__(
        self,
        target: str | Any,
        *,
        max_size: int = 10,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        source: _AsyncPoolSource | _AsyncSingleSource
        if isinstance(target, str):
            source = _AsyncPoolSource(Settings.from_url(target, connect_timeout), max_size)
        else:
            source = _AsyncSingleSource(target)
        super().__init__(source, MariaDBDialect(), instrumentation=instrumentation)

    async def migrate(self) -> list[str]:
        """Apply pending schema migrations; return the versions applied.

        MariaDB commits each DDL statement at once, so migrations are not one
        transaction: migrators on many nodes take turns under a named lock
        (``GET_LOCK``), and one that finds the work done does nothing.
        """
        async with self._source.connection() as conn:
            deadline = time.monotonic() + MIGRATION_LOCK_WAIT
            while not (await conn.fetch(self._dialect.query("migrations_lock", seconds=1)))[0][
                "locked"
            ]:
                if time.monotonic() > deadline:
                    raise StoreUnavailable(
                        f"another migrator held the migrations lock for {MIGRATION_LOCK_WAIT} s"
                    )
            try:
                return await conn.perform(migrate(self._dialect), atomic=False, write=True)
            finally:
                await conn.fetch(self._dialect.query("migrations_unlock"))
