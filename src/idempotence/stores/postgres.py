"""The PostgreSQL key store on psycopg 3, sync and async (DESIGN 8: the reference).

The claim is one ``INSERT ... ON CONFLICT`` statement in autocommit: one round trip
(see ``sql/postgres/queries.sql``). The store works with a pool it opens from a
conninfo, with the application's own ``psycopg_pool`` pool, or with one connection
the application already has (then its operations share that connection's
transactions, which is what request-as-transaction mode wants).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
    nullcontext,
    suppress,
)
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

try:
    import psycopg
    import psycopg_pool
    from psycopg import pq
    from psycopg.rows import dict_row
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the PostgreSQL store needs psycopg 3: pip install 'idempotence[postgres]'"
    ) from exc

from ..errors import SchemaMissing, StoreError, StoreUnavailable
from ..observability import Instrumentation
from ..states import ClaimRequest
from ._driver import Blocks, TransientError, run, run_async
from ._listener import AsyncListener, Listener, mark_waiter
from ._ops import Dialect, Op, Query, Row, claim_in_one_statement
from ._store import AsyncStore, Store

#: Seconds to wait for a connection before the store reports itself unavailable
#: (P11): a request should get its 503 quickly, not after libpq's default minutes.
DEFAULT_CONNECT_TIMEOUT = 5.0

T = TypeVar("T")


class PostgresDialect(Dialect):
    name = "postgres"
    claim_is_one_statement = True

    def timestamp(self, value: Any) -> datetime:
        assert isinstance(value, datetime)
        return value.astimezone(UTC)

    def duration_in(self, value: timedelta | None) -> Any:
        return value

    def duration_out(self, value: Any) -> timedelta:
        assert isinstance(value, timedelta)
        return value

    def claim(self, request: ClaimRequest) -> Op[Any]:
        return claim_in_one_statement(self, request)


def translate(exc: BaseException) -> StoreError:
    """The library's error for a psycopg or pool error (the caller raises it ``from``)."""
    sqlstate = getattr(exc, "sqlstate", None) or ""
    # Class 40 is "transaction rollback": serialization failure, deadlock.
    if sqlstate.startswith("40"):
        return TransientError(f"PostgreSQL aborted the transaction: {exc}")
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
        # No table, or one from an older release: the migrations have not run.
        return SchemaMissing(
            f"The key store's schema is missing or older than this release ({exc}): "
            "run `idempotence migrate --database URL`"
        )
    # No SQLSTATE means libpq itself failed (refused, reset, timed out); class 08 is a
    # connection exception, 57P0x a server shutting down or starting, 53 out of
    # resources (too many connections).
    if (
        isinstance(exc, psycopg_pool.PoolTimeout)
        or (isinstance(exc, psycopg.OperationalError) and not sqlstate)
        or sqlstate.startswith(("08", "57P", "53"))
    ):
        return StoreUnavailable(f"PostgreSQL is unavailable: {exc}")
    return StoreError(f"PostgreSQL error: {exc}")


_DRIVER_ERRORS = (psycopg.Error, psycopg_pool.PoolTimeout)


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except _DRIVER_ERRORS as exc:
        raise translate(exc) from exc


def _has_rows(cur: Any) -> bool:
    result = cur.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


# -- a transaction in two round trips ---------------------------------------------------
#
# On the store's own connections (autocommit, no transaction open) a transaction that
# opens with an operation (a request-as-transaction claim, F3) sends the BEGIN and the
# operation's first statement in one pipeline, and the statements deferred to its
# commit (the finish) with the COMMIT in another: two round trips where there were
# four, and a shorter transaction. The store sends BEGIN, COMMIT and ROLLBACK itself,
# so a rollback keeps the connection's prepared statements (psycopg's own transaction
# deallocates them all at every rollback). Anywhere else (an application's connection,
# a transaction already open) psycopg's transaction() is used, one statement a trip.

# A deferred statement goes out with the COMMIT, before anyone can look at its rows. A
# fenced write that the fence refuses (F1) matches no row; wrapped so, it fails instead
# (a division by zero), the server skips the COMMIT queued behind it, and the
# transaction can only roll back. Its one row says the write went through.
_FAIL_UNLESS_APPLIED = "WITH applied AS ({statement}) SELECT 1 / count(*) AS applied FROM applied"


def _pipelines(raw: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    return (
        raw.autocommit
        and raw.info.transaction_status == pq.TransactionStatus.IDLE
        and psycopg.Pipeline.is_supported()
    )


def _deferred_sql(query: Query) -> str:
    return _FAIL_UNLESS_APPLIED.format(statement=query.sql.strip().rstrip(";"))


def _settle_deferred(deferred: list[Op[Any]], rows: list[list[Row]], refused: bool) -> None:
    """Hand each deferred operation the rows of the statement that went out with the
    COMMIT: none for the one the fence refused, which raises (LockLost)."""
    while deferred:
        op = deferred.pop(0)
        got = rows.pop(0) if rows else []
        try:
            op.send(got)
        except StopIteration:
            continue
        op.close()
        # Sent after the COMMIT, a second statement would run outside the transaction.
        raise StoreError("an operation deferred to a commit must be one statement")
    if refused:  # every operation checks its rows; this is the backstop
        raise StoreError("a statement sent with the COMMIT was refused; nothing was committed")


# -- sync ------------------------------------------------------------------------------


class _Connection:
    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw
        self._blocks = Blocks()

    def fetch(self, query: Query) -> list[Row]:
        with _translated(), self.raw.cursor(row_factory=dict_row) as cur:
            # No parameters: a script of several statements (migrations) is allowed.
            cur.execute(query.sql, query.params or None)
            # pgresult.status is what cur.description would tell, without building a
            # column description per statement (measurable on the hot path).
            return cur.fetchall() if _has_rows(cur) else []

    @contextmanager
    def atomic(self, first: Op[T] | None = None) -> Iterator[T | None]:
        # Only the transaction's own begin and commit are translated: an error from
        # the application's statements in between stays the application's error.
        if _pipelines(self.raw):
            with self._pipelined(first) as result:
                yield result
            return
        tx = self.raw.transaction()
        with _translated():
            tx.__enter__()
        try:
            with self._blocks.body(self, first) as result:
                yield result
        except BaseException as exc:
            with _translated():
                tx.__exit__(type(exc), exc, exc.__traceback__)
            raise
        with _translated():
            tx.__exit__(None, None, None)

    @contextmanager
    def _pipelined(self, first: Op[T] | None) -> Iterator[T | None]:
        with self._blocks.block() as deferred:
            try:
                result = self._begin(first)
                yield result
                self._blocks.seal(deferred)
                self._commit(deferred)
            except BaseException:
                self._rollback()
                raise

    def _begin(self, first: Op[T] | None) -> T | None:
        if first is None:
            with _translated():
                self.raw.execute("BEGIN")
            return None
        with _translated(), self.raw.cursor(row_factory=dict_row) as cur:
            query = next(first)
            with self.raw.pipeline():
                self.raw.execute("BEGIN")
                cur.execute(query.sql, query.params)
            rows = cur.fetchall() if _has_rows(cur) else []
        return run(first, self, rows)

    def _commit(self, deferred: list[Op[Any]]) -> None:
        cursors, refused = [], False
        try:
            if not deferred:  # nothing to send with it: no pipeline to pay for
                self.raw.execute("COMMIT")
                return
            with self.raw.pipeline():
                for op in deferred:
                    query = next(op)
                    cursors.append(cur := self.raw.cursor(row_factory=dict_row))
                    cur.execute(_deferred_sql(query), query.params)
                self.raw.execute("COMMIT")
        except psycopg.errors.DivisionByZero:
            refused = True
        except _DRIVER_ERRORS as exc:
            raise translate(exc) from exc
        rows = [cur.fetchall() if _has_rows(cur) else [] for cur in cursors]
        _settle_deferred(deferred, rows, refused)

    def _rollback(self) -> None:
        # Nothing to roll back after a COMMIT that failed: the server ended it. A
        # connection too broken to roll back is the pool's to discard; the error that
        # got us here is the one to report.
        if self.raw.info.transaction_status != pq.TransactionStatus.IDLE:
            with suppress(psycopg.Error):
                self.raw.execute("ROLLBACK")

    def defer(self, op: Op[Any]) -> None:
        self._blocks.defer(op)

    def unit(self, *, write: bool = True) -> AbstractContextManager[None]:
        # In autocommit one statement commits itself: one round trip. Otherwise a
        # statement would leave a transaction open, so give it one.
        return nullcontext() if self.raw.autocommit else self.atomic()


# The store's statements are prepared by psycopg after a few runs, and PostgreSQL may
# then cache one generic plan per statement for the connection's life. A generic plan
# made while the key table is nearly empty cannot tell the (scope, key) index from the
# (scope, id) one, and may pick an index scan on the scope alone: every later claim and
# finish then reads the whole scope, slower at every key the table gains. Only an
# ANALYZE of the table replaces such a plan (and autovacuum may be off). So the pools
# the store opens plan each run with its own keys (custom plans), which always finds
# the unique row. The price is the planning: about 0.15 ms of server CPU for the claim
# (measured here), against a scan that grows without bound. An application that runs
# its own statements in a request's transaction on these connections gets custom
# plans too, as it would without prepared statements.
_CUSTOM_PLANS = "SET plan_cache_mode = force_custom_plan"


def _configure(conn: psycopg.Connection[Any]) -> None:
    conn.execute(_CUSTOM_PLANS)


async def _configure_async(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(_CUSTOM_PLANS)


class _PoolSource:
    def __init__(self, pool: psycopg_pool.ConnectionPool[Any], *, owned: bool) -> None:
        self.pool = pool
        self._owned = owned

    @contextmanager
    def connection(self) -> Iterator[_Connection]:
        with _translated():
            cm = self.pool.connection()
            raw = cm.__enter__()
        try:
            yield _Connection(raw)
        except BaseException as exc:
            cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        cm.__exit__(None, None, None)

    def close(self) -> None:
        if self._owned:
            self.pool.close()


class _SingleSource:
    """The application's one connection; operations take turns on it."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self._conn = _Connection(raw)
        # Re-entrant: a thread inside store.transaction() may call the store again.
        self._lock = threading.RLock()

    @contextmanager
    def connection(self) -> Iterator[_Connection]:
        with self._lock:
            yield self._conn

    def close(self) -> None:
        pass  # the application owns it


class PostgresStore(Store):
    """The PostgreSQL key store (sync).

    ``target`` is a conninfo or ``postgresql://`` URL (the store opens and owns a
    pool), a ``psycopg_pool.ConnectionPool``, or a ``psycopg.Connection``.

    >>> store = PostgresStore("postgresql://app@db/app")   # doctest: +SKIP
    >>> store.claim(ClaimRequest(scope="acct_1", key="k1", fingerprint=fp))  # doctest: +SKIP
    """

    def __init__(
        self,
        target: str | psycopg_pool.ConnectionPool[Any] | psycopg.Connection[Any],
        *,
        max_size: int = 10,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        source: _PoolSource | _SingleSource
        if isinstance(target, str):
            pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
                target,
                min_size=1,
                max_size=max_size,
                timeout=connect_timeout,
                kwargs={"autocommit": True, "connect_timeout": max(int(connect_timeout), 1)},
                configure=_configure,
                open=False,
            )
            pool.open(wait=False)
            source = _PoolSource(pool, owned=True)
        elif isinstance(target, psycopg_pool.ConnectionPool):
            source = _PoolSource(target, owned=False)
        else:
            source = _SingleSource(target)
        super().__init__(source, PostgresDialect(), instrumentation=instrumentation)
        self._listener = _listener(Listener, self._dialect, target, connect_timeout)

    def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        """P10: return as soon as a NOTIFY says the key settled, or after ``seconds``.

        The notifications come on one connection of the store's own, opened at the
        first wait (see :mod:`idempotence.stores._listener`). A store on the
        application's one connection has none, and sleeps ``seconds``.
        """
        if self._listener is None:
            super().wait_for_settle(scope, key, seconds)
            return
        self._listener.wait(
            scope, key, seconds, lambda: self._own(lambda: mark_waiter(self._dialect, scope, key))
        )

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        super().close()


# -- async -----------------------------------------------------------------------------


class _AsyncConnection:
    def __init__(self, raw: psycopg.AsyncConnection[Any]) -> None:
        self.raw = raw
        self._blocks = Blocks()

    async def fetch(self, query: Query) -> list[Row]:
        with _translated():
            async with self.raw.cursor(row_factory=dict_row) as cur:
                await cur.execute(query.sql, query.params or None)
                return await cur.fetchall() if _has_rows(cur) else []

    @asynccontextmanager
    async def atomic(self, first: Op[T] | None = None) -> AsyncIterator[T | None]:
        if _pipelines(self.raw):
            async with self._pipelined(first) as result:
                yield result
            return
        tx = self.raw.transaction()
        with _translated():
            await tx.__aenter__()
        try:
            async with self._blocks.body_async(self, first) as result:
                yield result
        except BaseException as exc:
            with _translated():
                await tx.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        with _translated():
            await tx.__aexit__(None, None, None)

    @asynccontextmanager
    async def _pipelined(self, first: Op[T] | None) -> AsyncIterator[T | None]:
        with self._blocks.block() as deferred:
            try:
                result = await self._begin(first)
                yield result
                self._blocks.seal(deferred)
                await self._commit(deferred)
            except BaseException:
                await self._rollback()
                raise

    async def _begin(self, first: Op[T] | None) -> T | None:
        if first is None:
            with _translated():
                await self.raw.execute("BEGIN")
            return None
        with _translated():
            async with self.raw.cursor(row_factory=dict_row) as cur:
                query = next(first)
                async with self.raw.pipeline():
                    await self.raw.execute("BEGIN")
                    await cur.execute(query.sql, query.params)
                rows = await cur.fetchall() if _has_rows(cur) else []
        return await run_async(first, self, rows)

    async def _commit(self, deferred: list[Op[Any]]) -> None:
        cursors, refused = [], False
        try:
            if not deferred:
                await self.raw.execute("COMMIT")
                return
            async with self.raw.pipeline():
                for op in deferred:
                    query = next(op)
                    cursors.append(cur := self.raw.cursor(row_factory=dict_row))
                    await cur.execute(_deferred_sql(query), query.params)
                await self.raw.execute("COMMIT")
        except psycopg.errors.DivisionByZero:
            refused = True
        except _DRIVER_ERRORS as exc:
            raise translate(exc) from exc
        rows = [await cur.fetchall() if _has_rows(cur) else [] for cur in cursors]
        _settle_deferred(deferred, rows, refused)

    async def _rollback(self) -> None:
        if self.raw.info.transaction_status != pq.TransactionStatus.IDLE:
            with suppress(psycopg.Error):
                await self.raw.execute("ROLLBACK")

    def defer(self, op: Op[Any]) -> None:
        self._blocks.defer(op)

    def unit(self) -> AbstractAsyncContextManager[None]:
        return nullcontext() if self.raw.autocommit else self.atomic()

    async def perform(self, op: Op[T], *, atomic: bool, write: bool) -> T:
        async with self.atomic() if atomic else self.unit():
            return await run_async(op, self)

    async def run_in_transaction(self, op: Op[T]) -> T:
        return await run_async(op, self)


class _AsyncPoolSource:
    def __init__(self, pool: psycopg_pool.AsyncConnectionPool[Any], *, owned: bool) -> None:
        self.pool = pool
        self._owned = owned
        self._opened = not owned

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[_AsyncConnection]:
        if not self._opened:
            # An async pool cannot open in __init__; the first use opens it.
            await self.pool.open(wait=False)
            self._opened = True
        with _translated():
            cm = self.pool.connection()
            raw = await cm.__aenter__()
        try:
            yield _AsyncConnection(raw)
        except BaseException as exc:
            await cm.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await cm.__aexit__(None, None, None)

    async def close(self) -> None:
        if self._owned and self._opened:
            await self.pool.close()


class _AsyncSingleSource:
    def __init__(self, raw: psycopg.AsyncConnection[Any]) -> None:
        self._conn = _AsyncConnection(raw)
        self._lock = asyncio.Lock()
        self._holder: object = None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[_AsyncConnection]:
        task = asyncio.current_task()
        if self._holder is task:  # re-entrant, like the sync twin's RLock
            yield self._conn
            return
        async with self._lock:
            self._holder = task
            try:
                yield self._conn
            finally:
                self._holder = None

    async def close(self) -> None:
        pass


class AsyncPostgresStore(AsyncStore):
    """The PostgreSQL key store (async); ``target`` as for :class:`PostgresStore`,
    with ``psycopg_pool.AsyncConnectionPool`` and ``psycopg.AsyncConnection``."""

    def __init__(
        self,
        target: str | psycopg_pool.AsyncConnectionPool[Any] | psycopg.AsyncConnection[Any],
        *,
        max_size: int = 10,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        source: _AsyncPoolSource | _AsyncSingleSource
        if isinstance(target, str):
            pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
                target,
                min_size=1,
                max_size=max_size,
                timeout=connect_timeout,
                kwargs={"autocommit": True, "connect_timeout": max(int(connect_timeout), 1)},
                configure=_configure_async,
                open=False,
            )
            source = _AsyncPoolSource(pool, owned=True)
        elif isinstance(target, psycopg_pool.AsyncConnectionPool):
            source = _AsyncPoolSource(target, owned=False)
        else:
            source = _AsyncSingleSource(target)
        super().__init__(source, PostgresDialect(), instrumentation=instrumentation)
        self._listener = _listener(AsyncListener, self._dialect, target, connect_timeout)

    async def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        """The awaitable twin of :meth:`PostgresStore.wait_for_settle`."""
        if self._listener is None:
            await super().wait_for_settle(scope, key, seconds)
            return
        await self._listener.wait(
            scope,
            key,
            seconds,
            lambda: self._own(lambda: mark_waiter(self._dialect, scope, key)),
        )

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.close()
        await super().close()


L = TypeVar("L", Listener, AsyncListener)


def _listener(
    kind: type[L],
    dialect: Dialect,
    target: object,
    connect_timeout: float,
) -> L | None:
    """The P10 listener of a store on ``target``: it connects as the store's pool
    does. None on the application's own connection (its password cannot be read back)
    or a pool whose connection parameters are computed: that store's waits poll."""
    if isinstance(target, str):
        return kind(dialect, target, {}, connect_timeout)
    if isinstance(target, psycopg_pool.ConnectionPool | psycopg_pool.AsyncConnectionPool):
        conninfo, kwargs = target.conninfo, target.kwargs
        # A pool may compute them for each connection (callables): then waits poll.
        if isinstance(conninfo, str) and (kwargs is None or isinstance(kwargs, dict)):
            return kind(dialect, conninfo, kwargs or {}, connect_timeout)
    return None
