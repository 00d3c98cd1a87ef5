"""The key store on an application's SQLAlchemy engine: the claim, the ORM writes and
the stored response in one transaction of the application's own (R2, F3).

The store takes its connections from the application's engine and runs its statements
through them (``exec_driver_sql``), so that SQLAlchemy always knows the state of the
transaction: the store begins and ends it with SQLAlchemy's own ``begin()``,
``begin_nested()``, ``commit()`` and ``rollback()``, never behind its back.

Who does what, in ``store.transaction()`` (a flow's phase, a request-as-transaction
endpoint):

* the store checks out a connection and begins its transaction (on SQLite with
  ``BEGIN IMMEDIATE``, so that the claim's read and write are one serializable unit,
  P6); given a claim, the claim is its first statement;
* ``tx.session`` is an ORM session of the application's (its ``sessionmaker``, when
  the store was given one) bound to that connection, created at first use and joined
  to the transaction as ``rollback_only``: its ``commit()`` only flushes, its
  ``rollback()`` aborts the whole transaction, the claim with it;
* before each of the store's own statements in the transaction (a checkpoint, the
  finish) the session is flushed, so the store's write is the last (R2);
* at the end of the block the session is flushed, the statements deferred to the
  commit (the stored response, ``at_commit``) run, and the store commits; on an
  exception it rolls back. Either way it closes the session and returns the connection.

A block opened while the connection's transaction is open is a savepoint
(``begin_nested()``). So is every block of a store bound to the application's own
session or connection (`_AsyncBoundSource`): the application's transaction
commits the claim, its writes and the stored response, or rolls them back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar, cast

from .._concurrency import AsyncLock
from ..errors import StoreUnavailable
from ..observability import Instrumentation
from ..stores.capabilities import Capability
from ..stores.sql import AsyncStore, AsyncTransaction, Blocks, Dialect, Op, Query, Row, run_async
from ._sqlalchemy_shared import (
    JOIN_MODE,
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    AsyncSessionMaker,
    dialect_for,
    driver_of,
    require_active,
    translated,
)

T = TypeVar("T")


class _AsyncSqlConnection:
    """A SQLAlchemy connection, as the store uses it."""

    def __init__(
        self,
        raw: AsyncConnection,
        dialect: Dialect,
        sessions: Callable[..., AsyncSession],
        *,
        own_session: bool = True,
    ) -> None:
        #: The SQLAlchemy connection: the application's Core statements run on it.
        self.raw = raw
        self._dialect = dialect
        self._sessions = sessions
        # False: the session is the application's (a store bound to it): never closed.
        self._own_session = own_session
        self._session: AsyncSession | None = None
        self._blocks = Blocks()
        # The SQLAlchemy transactions of the open blocks, outermost first.
        self._open: list[Any] = []

    def session(self) -> AsyncSession:
        """The ORM session bound to this connection's transaction (made at first use)."""
        if not self._open:
            raise StoreUnavailable("the store's transaction has ended: its session is gone")
        if self._session is None:
            self._session = self._sessions(bind=self.raw, join_transaction_mode=JOIN_MODE)
        return self._session

    async def fetch(self, query: Query) -> list[Row]:
        with translated(self._dialect):
            return await self._fetch(query)

    async def _fetch(self, query: Query) -> list[Row]:
        # No parameters: a script of several statements (a migration) is allowed.
        result = await self.raw.exec_driver_sql(query.sql, dict(query.params) or None)
        if not result.returns_rows:
            return []
        return [dict(row) for row in result.mappings().all()]

    def atomic(self, first: Op[T] | None = None) -> AbstractAsyncContextManager[T | None]:
        return self._block(first, write=True)

    @asynccontextmanager
    async def _block(self, first: Op[T] | None, *, write: bool) -> AsyncIterator[T | None]:
        await self._enter(write=write)
        with self._blocks.block() as deferred:
            try:
                result = None if first is None else await run_async(first, _Claiming(self))
                yield result
                await self._flush()
                self._blocks.seal(deferred)
                while deferred:
                    await run_async(deferred.pop(0), self)
            except BaseException:
                await self._exit(commit=False)
                raise
            await self._exit(commit=True)

    async def _enter(self, *, write: bool) -> None:
        with translated(self._dialect):
            # Inside a transaction (ours, or the application's on a bound store), a
            # block is a savepoint: the outer transaction commits with its owner.
            nested = bool(self._open) or self.raw.in_transaction()
            if nested:
                await self._flush()
            else:
                self._open.append(await self.raw.begin())
            sqlite = self._dialect.name == "sqlite"
            if (write or nested) and sqlite and not driver_of(self.raw).in_transaction:
                # The write lock now: the claim's read and write are one unit (P6), and
                # a phase never deadlocks upgrading a read lock. SQLAlchemy commits and
                # rolls back through the driver, which sees the transaction. (A first
                # SAVEPOINT would open a transaction whose RELEASE commits it.)
                await self.raw.exec_driver_sql("BEGIN IMMEDIATE")
            if nested:
                self._open.append(await self.raw.begin_nested())

    async def _exit(self, *, commit: bool) -> None:
        transaction = self._open.pop()
        try:
            with translated(self._dialect):
                if commit:
                    require_active(transaction)
                    await transaction.commit()
                elif transaction.is_active:
                    await transaction.rollback()
        finally:
            if not self._open and self._session is not None:
                session, self._session = self._session, None
                if self._own_session:
                    await session.close()

    async def _flush(self) -> None:
        if self._session is not None:
            await self._session.flush()
        if self._open:
            require_active(self._open[-1])

    def defer(self, op: Op[Any]) -> None:
        self._blocks.defer(op)

    async def perform(self, op: Op[T], *, atomic: bool, write: bool) -> T:
        # Always a transaction (SQLAlchemy begins one anyway), which the store commits;
        # on SQLite a read takes no write lock.
        async with self._block(None, write=atomic or write):
            return await run_async(op, self)

    async def run_in_transaction(self, op: Op[T]) -> T:
        # The application's pending ORM writes first: the store's statement is last.
        await self._flush()
        return await run_async(op, self)


class _Claiming:
    """The connection for a claim that opens a transaction: on PostgreSQL each of its
    statements waits for a row lock at most ``CLAIM_LOCK_WAIT`` (F8), as on the
    PostgreSQL store's own connections; one that ran out is ``KeyHeld``."""

    def __init__(self, conn: _AsyncSqlConnection) -> None:
        self._conn = conn

    async def fetch(self, query: Query) -> list[Row]:
        conn = self._conn
        if conn._dialect.name != "postgres":
            return await conn.fetch(query)
        from ..stores.postgres import bounded_claim

        with translated(conn._dialect, claim=True):
            # The claim statement bounds its own lock wait and restores the setting.
            return await conn._fetch(Query(query.name, bounded_claim(query), query.params))


class _AsyncEngineSource:
    """Connections from the application's engine (its pool); the engine stays the
    application's, open after the store closes."""

    def __init__(
        self, engine: AsyncEngine, dialect: Dialect, sessions: Callable[..., AsyncSession]
    ) -> None:
        self.engine = engine
        self._dialect = dialect
        self._sessions = sessions

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[_AsyncSqlConnection]:
        with translated(self._dialect):
            raw = await self.engine.connect()
        try:
            yield _AsyncSqlConnection(raw, self._dialect, self._sessions)
        finally:
            # Back to the pool, which rolls back whatever an interrupted block left.
            await raw.close()

    async def close(self) -> None:
        pass  # the application's engine


class _AsyncBoundSource:
    """The application's one session or connection: the store's blocks are
    savepoints of the application's transaction when it has one open (a session
    always has: asking it for its connection begins it), which commits with the
    application; turns are taken."""

    def __init__(self, target: AsyncSession | AsyncConnection, dialect: Dialect) -> None:
        self._target = target
        self._dialect = dialect
        self._lock = AsyncLock()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[_AsyncSqlConnection]:
        async with self._lock:
            target = self._target
            if isinstance(target, AsyncSession):
                with translated(self._dialect):
                    raw = await target.connection()
                yield _AsyncSqlConnection(raw, self._dialect, lambda **_: target, own_session=False)
            else:
                yield _AsyncSqlConnection(target, self._dialect, _default_sessions)

    async def close(self) -> None:
        pass  # the application's


def _default_sessions(**kw: Any) -> AsyncSession:
    return AsyncSession(expire_on_commit=False, **kw)


class AsyncSQLAlchemyTransaction(AsyncTransaction):
    """The store's transaction on a SQLAlchemy connection: `connection` is the
    SQLAlchemy ``AsyncConnection`` and
    [`session`][idempotence.contrib.sqlalchemy.AsyncSQLAlchemyTransaction.session] an
    ``AsyncSession`` on it."""

    @property
    def session(self) -> AsyncSession:
        """The ORM session in this transaction: what it writes commits with the claim
        and the stored response, or not at all. Its ``commit()`` only flushes (the
        store commits); its ``rollback()`` aborts the whole transaction."""
        # Not an isinstance assert: past its block the connection is one that refuses
        # every use with TransactionEnded (stores/_sql/gate.py: ENDED), and so must this.
        return cast(_AsyncSqlConnection, self._conn).session()


def _resolve_async(
    target: AsyncEngine | AsyncSessionMaker[Any],
) -> tuple[AsyncEngine, Callable[..., AsyncSession]]:
    if isinstance(target, AsyncEngine):
        return target, _default_sessions
    if isinstance(target, AsyncSessionMaker):
        bind = target.kw.get("bind")
        if isinstance(bind, AsyncEngine):
            return bind, target
    from ..errors import ConfigurationError

    raise ConfigurationError(
        "AsyncSQLAlchemyStore takes the application's engine or a session factory bound "
        "to it (async: AsyncEngine, async_sessionmaker; sync: Engine, sessionmaker), "
        f"not {target!r}"
    )


class AsyncSQLAlchemyStore(AsyncStore):
    """The key store on the application's SQLAlchemy engine (PostgreSQL with psycopg 3,
    or SQLite). ``target`` is the application's engine, or its session factory bound
    to it (then ``tx.session`` is one of its sessions): ``AsyncEngine`` or
    ``async_sessionmaker`` for the async store, ``Engine`` or ``sessionmaker`` for the
    sync one.

    Or ``target`` is one ``AsyncSession`` (or ``AsyncConnection``) of the application's:
    then the store runs in the application's transaction, its blocks are savepoints,
    and what it claims and stores commits when the application commits (``tx.session``
    is the application's session). Such a store serves one task at a time.

    ```python
    engine = create_async_engine("postgresql+psycopg://app@db/app")
    store = AsyncSQLAlchemyStore(async_sessionmaker(engine))
    async with store.transaction(claim=request) as tx:
        tx.session.add(Transfer(amount=2000))
        await store.finish(tx.claim.lease, response, tx=tx, at_commit=True)
    ```
    """

    _transaction_type = AsyncSQLAlchemyTransaction

    capabilities = frozenset({Capability.TRANSACTIONS, Capability.WAITING})
    """A SQL store whose waiting twins poll (P10): it has no connection of its own to
    LISTEN on, whatever the engine's database."""

    def __init__(
        self,
        target: AsyncEngine | AsyncSessionMaker[Any] | AsyncSession | AsyncConnection,
        *,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        source: _AsyncEngineSource | _AsyncBoundSource
        if isinstance(target, AsyncSession | AsyncConnection):
            dialect = dialect_for(_bound_engine(target))
            source = _AsyncBoundSource(target, dialect)
        else:
            engine, sessions = _resolve_async(target)
            dialect = dialect_for(_sync_engine(engine))
            source = _AsyncEngineSource(engine, dialect, sessions)
        super().__init__(source, dialect, instrumentation=instrumentation)

    @property
    def engine(self) -> AsyncEngine:
        """The application's engine the store runs on (not on a bound store)."""
        source = self._source
        assert isinstance(source, _AsyncEngineSource)
        return source.engine


def _sync_engine(engine: AsyncEngine) -> Any:
    return getattr(engine, "sync_engine", engine)


def _bound_engine(target: AsyncSession | AsyncConnection) -> Any:
    bind = target.bind if isinstance(target, AsyncSession) else target
    if isinstance(bind, AsyncConnection):
        bind = bind.engine
    if not isinstance(bind, AsyncEngine):
        from ..errors import ConfigurationError

        raise ConfigurationError(f"bind the session to an engine or a connection: {target!r}")
    return _sync_engine(bind)
