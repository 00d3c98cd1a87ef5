"""The PostgreSQL key store on psycopg 3 (DESIGN 8: the reference).

The claim is one ``INSERT ... ON CONFLICT`` statement in autocommit: one round trip
(see ``sql/postgres/queries.sql``). The store works with a pool it opens from a
conninfo, with the application's own ``psycopg_pool`` pool, or with one connection
the application already has (then its operations share that connection's
transactions, which is what request-as-transaction mode wants).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import (
    AbstractAsyncContextManager,
    asynccontextmanager,
    nullcontext,
    suppress,
)
from typing import Any, Generic, TypeVar

import psycopg
import psycopg_pool
from psycopg.rows import dict_row

from ..._concurrency import AsyncLock, acquire_async
from ...errors import StoreUnavailable
from ...observability import Instrumentation
from .._listener_async import AsyncListener
from .._listener_shared import mark_waiter
from .._sql.connection_async import AsyncSingleSource, body_async, run_async
from .._sql.ops import APPLICATION, Op, Query, Row
from .._sql.retry import Blocks, KeyHeld
from .._sql.store_async import AsyncStore
from ..capabilities import Capability
from ._breaker import Breaker, closed_by_server
from ._replication import REPLICATION_SQL, ReplicationState, describe, report
from ._store_shared import (
    COMMIT_PLANNING,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    DRIVER_ERRORS,
    IDLE,
    INTRANS,
    TRANSACTION_PLANNING,
    Cursors,
    PostgresDialect,
    bounded_claim,
    check_statement_timeout,
    connection_options,
    deferred_sql,
    has_rows,
    held,
    listener,
    pipelines,
    pool_name,
    session_settings,
    settle_deferred,
    translate,
    translated,
)
from ._watchdog import NOT_REPLICATED, Watchdog

T = TypeVar("T")


# A transaction in two round trips on the store's own connections: see _store_shared.


class AsyncPostgresConnection:
    """A [`AsyncConnection`][idempotence.stores.sql.AsyncConnection] on one psycopg connection:
    the store's statements on it, its transactions, and the statements deferred to
    their commit, pipelined with the BEGIN and the COMMIT where it can.

    Args:
        raw: the psycopg connection (the application's, or one of the store's pool).
        own: whether the connection is the store's own (then a transaction it opens
            restores the application's planning settings).
    """

    def __init__(self, raw: psycopg.AsyncConnection[Any], *, own: bool = False) -> None:
        self.raw = raw
        #: The statements that open a transaction: on the store's own connections the
        #: planning settings come back to the application's (TRANSACTION_PLANNING).
        self._opening = ("BEGIN", *TRANSACTION_PLANNING) if own else ("BEGIN",)
        #: A transaction that opens with a claim takes them from the claim instead.
        self._planning = own
        self._blocks = Blocks()
        self._cursors: Cursors[psycopg.AsyncCursor[Any]] = Cursors(raw)
        self._statements = self._cursors.statements
        self._control = self._cursors.control
        self._for_application = self._cursors.application

    async def fetch(self, query: Query) -> list[Row]:
        # A try costs nothing until a statement fails; `with translated()`, three calls.
        try:
            if query.name == APPLICATION:
                # Prepared as psycopg does, and planned as the server is configured.
                cur = self._for_application()
                await cur.execute(query.sql, query.params or None)
                return await cur.fetchall() if has_rows(cur) else []
            cur = self._statements(query.sql if query.params else "")
            # The store's own statements inside a transaction on its own connections are
            # planned at this run (see TRANSACTION_PLANNING).
            ours = self._planning and self.raw.pgconn.transaction_status == INTRANS
            prepare = False if ours else None
            # No parameters: a script of several statements (migrations) is allowed.
            await cur.execute(query.sql, query.params or None, prepare=prepare)
            # pgresult.status is what cur.description would tell, without building
            # a column description per statement (measurable on the hot path).
            return await cur.fetchall() if has_rows(cur) else []
        except DRIVER_ERRORS as exc:
            raise translate(exc, own=query.name != APPLICATION) from exc

    def atomic(self, first: Op[T] | None = None) -> AbstractAsyncContextManager[T | None]:
        # On the store's own connections, the pipelined block (a class: no generator
        # wraps another for every request-as-transaction).
        if pipelines(self.raw):
            return _AsyncPipelined(self, first)
        return self._driver_transaction(first)

    @asynccontextmanager
    async def _driver_transaction(self, first: Op[T] | None) -> AsyncIterator[T | None]:
        # Only the transaction's own begin and commit are translated: an error from
        # the application's statements in between stays the application's error.
        tx = self.raw.transaction()
        with translated():
            await tx.__aenter__()
            if len(self._opening) > 1:  # the planning settings, in one trip
                await self._control().execute("; ".join(self._opening[1:]))
        try:
            async with body_async(self._blocks, self, first) as result:
                yield result
        except BaseException as exc:
            with translated():
                await tx.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        with translated():
            await tx.__aexit__(None, None, None)

    async def _rollback(self) -> None:
        # Nothing to roll back after a COMMIT that failed: the server ended it. A
        # connection too broken to roll back is the pool's to discard; the error that
        # got us here is the one to report.
        if self.raw.pgconn.transaction_status != IDLE:
            with suppress(psycopg.Error):
                await self.raw.execute("ROLLBACK")

    def defer(self, op: Op[Any]) -> None:
        self._blocks.defer(op)

    def unit(self, *, write: bool = True) -> AbstractAsyncContextManager[None]:
        # In autocommit one statement commits itself: one round trip. Otherwise a
        # statement would leave a transaction open, so give it one.
        return nullcontext() if self.raw.autocommit else self.atomic()

    async def perform(self, op: Op[T], *, atomic: bool, write: bool) -> T:
        async with self.atomic() if atomic else self.unit(write=write):
            return await run_async(op, self)

    async def run_in_transaction(self, op: Op[T]) -> T:
        return await run_async(op, self)


class _AsyncPipelined(Generic[T]):
    """The block of a transaction on the store's own connection: BEGIN (with
    ``first``'s first statement), then at a clean exit what was deferred with the
    COMMIT; after an error, ROLLBACK. What was deferred and not sent is closed.

    The BEGIN and the COMMIT are sent by ``__aenter__`` and ``__aexit__`` themselves,
    not by methods of the connection that they would call (a frame more each): every
    request-as-transaction enters one."""

    __slots__ = ("_conn", "_deferred", "_first")

    def __init__(self, conn: AsyncPostgresConnection, first: Op[T] | None) -> None:
        self._conn = conn
        self._first = first
        self._deferred: list[Op[Any]] = []

    async def __aenter__(self) -> T | None:
        conn, first = self._conn, self._first
        deferred = self._deferred = conn._blocks.open()
        try:
            if first is None:
                with translated():
                    # Without parameters, psycopg sends them as one query: one round trip.
                    await conn._control().execute("; ".join(conn._opening))
                return None
            try:
                query = next(first)
                sql = bounded_claim(query, conn._planning)
                cur = conn._statements(sql)
                async with conn.raw.pipeline():
                    await conn._control().execute("BEGIN")
                    await cur.execute(sql, query.params)
                rows = await cur.fetchall() if has_rows(cur) else []
            except psycopg.errors.LockNotAvailable as exc:  # what held() does, in a try
                raise KeyHeld(str(exc)) from exc
            except DRIVER_ERRORS as exc:
                raise translate(exc) from exc
            # Nearly every claim settles at its first statement: its result in line;
            # a claim that runs again goes on in run_async.
            try:
                query = first.send(rows)
            except StopIteration as done:
                result: T = done.value
                return result
            return await run_async(first, AsyncBoundedClaim(conn), None, query)
        except BaseException:
            try:
                await conn._rollback()
            finally:
                conn._blocks.end(deferred)
            raise

    async def __aexit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        conn, deferred = self._conn, self._deferred
        try:
            if exc is not None:
                await conn._rollback()
                return
            conn._blocks.seal(deferred)
            cursors: list[psycopg.AsyncCursor[Row]] = []
            refused = False
            try:
                if not deferred:  # nothing to send with it: no pipeline to pay for
                    await conn._control().execute("COMMIT")
                    return
                control = conn._control()
                async with conn.raw.pipeline():
                    if conn._planning:
                        await control.execute(COMMIT_PLANNING)
                    for op in deferred:
                        query = next(op)
                        sql = deferred_sql(query)
                        # The connection's cursor for the first (the finish: nearly
                        # always the only one), a cursor each for any more.
                        if cursors:
                            cur = conn.raw.cursor(row_factory=dict_row)
                        else:
                            cur = conn._statements(sql)
                        cursors.append(cur)
                        await cur.execute(sql, query.params)
                    await control.execute("COMMIT")
            except psycopg.errors.DivisionByZero:
                refused = True
            except DRIVER_ERRORS as error:
                raise translate(error) from error
            rows = []
            # A loop: an async comprehension would be a coroutine more (async code).
            for cur in cursors:
                rows.append(await cur.fetchall() if has_rows(cur) else [])
            settle_deferred(deferred, rows, refused)
        except BaseException:
            if exc is None:  # the COMMIT (or what went with it) failed: roll back
                await conn._rollback()
            raise
        finally:
            conn._blocks.end(deferred)


class AsyncBoundedClaim:
    """The claim's connection for its further statements (a claim may run again, see
    ``claim_in_one_statement``): each waits for a lock no longer than the first (F8).

    Args:
        conn: the connection the claim runs on.
    """

    def __init__(self, conn: AsyncPostgresConnection) -> None:
        self._conn = conn

    async def fetch(self, query: Query) -> list[Row]:
        raw = self._conn.raw
        with translated(), held():
            async with raw.cursor(row_factory=dict_row) as cur:
                # Again, after its settings applied: planned at this run.
                planning = self._conn._planning
                prepare = False if planning else None
                await cur.execute(bounded_claim(query, planning), query.params, prepare=prepare)
                return await cur.fetchall() if has_rows(cur) else []


def _configure_async(
    settings: str, *, require_synchronous_standby: bool, breaker: Breaker
) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    seen: list[ReplicationState] = []

    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        # Plans without sequential scans (see SESSION_PLANNING), and the statement
        # bound (DESIGN 13).
        await conn.execute(settings)
        # The replication the COMMITs run on: said at the first connection and when
        # it changes (a failover), refused if a synchronous standby is required.
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(REPLICATION_SQL)
            state = describe(await cur.fetchone() or {})
        if require_synchronous_standby or not seen or seen[-1] != state:
            seen[:] = [state]
            refused = report(state, required=require_synchronous_standby)
            if refused is not None:
                raise StoreUnavailable(refused)
        # The server is back the moment the pool has a connection again (DESIGN 13:
        # within 2 s of a healed partition): the next request takes it at once, not
        # at the breaker's next probe.
        if breaker.troubled:
            breaker.healthy()

    return configure


class _AsyncPoolSource:
    def __init__(
        self,
        pool: psycopg_pool.AsyncConnectionPool[Any],
        *,
        owned: bool,
        breaker: Breaker | None = None,
        watchdog: Watchdog | None = None,
    ) -> None:
        self.pool = pool
        self._owned = owned
        self._opened = not owned
        self.breaker = breaker or Breaker(pool.name)
        #: Cancels what the server's statement_timeout does not end (DESIGN 13).
        self.watchdog = watchdog
        #: One checkout at a time waits in the pool's queue: see `_wait`.
        self._turn = AsyncLock()
        #: The store's view of each of the pool's connections, made once per connection
        #: (a view holds its connection: see `view` for how the map stays small).
        self._views: dict[psycopg.AsyncConnection[Any], AsyncPostgresConnection] = {}

    def view(self, raw: psycopg.AsyncConnection[Any]) -> AsyncPostgresConnection:
        conn = self._views.get(raw)
        if conn is None:
            # A connection the map has not seen replaces one the pool closed (or adds
            # one): forget the closed, so the map holds no more than the pool.
            for closed in [known for known in self._views if known.closed]:
                del self._views[closed]
            conn = self._views[raw] = AsyncPostgresConnection(raw, own=self._owned)
        return conn

    def connection(self) -> _AsyncCheckout:
        return _AsyncCheckout(self)

    async def checkout(self) -> psycopg.AsyncConnection[Any]:
        """A pooled connection the server has not closed (P11): one that has is
        discarded (after a restart, every idle one has), and the next is taken."""
        if not self._opened:
            # The first use opens the pool (an async pool cannot open in __init__).
            # Opening an open pool again does nothing, so a race here is harmless.
            await self.pool.open(wait=False)
            self._opened = True
        deadline = None
        for _ in range(self.pool.max_size + 1):
            raw = await self._wait(deadline)
            if not raw.closed and not (closed_by_server(raw.fileno()) and await self._dead(raw)):
                if self.breaker.troubled:
                    self.breaker.healthy()
                return raw
            self.breaker.broken("the server closed a pooled connection")
            # After a dead connection, the next ones share one short wait.
            deadline = deadline or self.breaker.deadline()
            await raw.close()  # the pool replaces it
            await self.pool.putconn(raw)
        raise StoreUnavailable("PostgreSQL is unavailable: every pooled connection was closed")

    async def _dead(self, raw: psycopg.AsyncConnection[Any]) -> bool:
        """A connection with something to read while idle is almost surely closed by
        the server; a round trip tells (an application's pool may hold a connection
        that LISTENs, and a notification is no reason to drop it)."""
        try:
            await self.pool.check_connection(raw)
        except psycopg.Error:
            return True
        return False

    async def _wait(self, deadline: float | None) -> psycopg.AsyncConnection[Any]:
        """Wait for a connection in short slices, up to the pool's timeout while the
        server is healthy (a busy pool), but no longer once it is known to be gone.

        A slice that runs out leaves the pool's queue, and the next joins it at the
        back, behind every checkout that came meanwhile: in a burst, the first could
        wait longest and time out while later ones got through. So the store's
        checkouts take turns to wait in the pool's queue, in the order they came, and
        the one whose turn it is keeps its place there. While the server is known to
        be down a checkout fails at once, without waiting for a turn.
        """
        give_up = time.monotonic() + self.pool.timeout
        self.breaker.check()
        if not await acquire_async(self._turn, self.pool.timeout):
            raise translate(
                psycopg_pool.PoolTimeout(
                    f"no connection from pool {self.pool.name!r} within its timeout "
                    f"({self.pool.timeout:g} s)"
                )
            )
        try:
            return await self._wait_in_turn(deadline, give_up)
        finally:
            self._turn.release()

    async def _wait_in_turn(
        self, deadline: float | None, give_up: float
    ) -> psycopg.AsyncConnection[Any]:
        while True:
            left = give_up - time.monotonic()
            try:
                raw: psycopg.AsyncConnection[Any] = await self.pool.getconn(
                    min(self.breaker.timeout(deadline), max(left, 0.001))
                )
                return raw
            except psycopg_pool.PoolTimeout as exc:
                if self.breaker.troubled:
                    raise self.breaker.timed_out(exc) from exc
                if time.monotonic() >= give_up:
                    raise translate(exc) from exc
            except DRIVER_ERRORS as exc:  # the pool is closed
                raise translate(exc) from exc

    async def close(self) -> None:
        # Final: a store closed before its first use never opens its pool, and a
        # closed pool refuses connections (the store is unavailable).
        if self.watchdog is not None:
            self.watchdog.close()
        opened, self._opened = self._opened, True
        if self._owned and opened:
            await self.pool.close()


class _AsyncCheckout:
    """One of the pool's connections for one operation, by ``getconn`` and ``putconn``:
    the pool's ``connection()`` wraps them in two context managers and a lock, every
    operation, to do what `__aexit__` does here only when there is something to
    do (a transaction left open commits, or rolls back after an error)."""

    __slots__ = ("_raw", "_source")

    def __init__(self, source: _AsyncPoolSource) -> None:
        self._source = source
        self._raw: psycopg.AsyncConnection[Any] | None = None

    async def __aenter__(self) -> AsyncPostgresConnection:
        raw = self._raw = await self._source.checkout()
        if self._source.watchdog is not None:
            self._source.watchdog.watch(raw)
        return self._source.view(raw)

    async def __aexit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        raw = self._raw
        assert raw is not None
        cancelled = False
        try:
            if exc is not None and raw.broken:
                self._source.breaker.broken(exc)
            if not raw.closed and raw.pgconn.transaction_status != IDLE:
                if exc is None:
                    await raw.commit()
                else:
                    with suppress(psycopg.Error):
                        await raw.rollback()
        finally:
            if self._source.watchdog is not None:
                cancelled = self._source.watchdog.unwatch(raw)
            await self._source.pool.putconn(raw)
        if cancelled and exc is None:
            # It returned, so the cancel ended a COMMIT's wait for a synchronous
            # standby: committed on the primary alone, which a failover loses.
            raise StoreUnavailable(NOT_REPLICATED)


class AsyncPostgresStore(AsyncStore):
    """The PostgreSQL key store.

    ``target`` is a conninfo or ``postgresql://`` URL (the store opens and owns a
    pool), a ``psycopg_pool.AsyncConnectionPool``, or a ``psycopg.AsyncConnection``.

    ``statement_timeout`` (seconds, None for no bound) bounds every wait of the store's
    own pool: a statement or COMMIT that runs or waits for a lock longer on the server,
    and a connection that goes unanswered that long on the network (a partition, a
    server that stopped answering), end in ``StoreUnavailable``, so a request is
    answered 503 within about that time. A pool or connection of your own keeps the
    settings you gave it: set ``statement_timeout``, ``tcp_user_timeout`` and
    keepalives there.

    The store logs the replication its database runs on at its first connection
    (synchronous, asynchronous: a failover may lose the last finished keys, or none),
    and again when it changes. ``require_synchronous_standby=True`` refuses every
    connection without a synchronous standby (``StoreUnavailable``: 503).

    ```python
    store = AsyncPostgresStore("postgresql://app@db/app")
    await store.claim(ClaimRequest(scope="acct_1", key="k1", fingerprint=fp))
    ```
    """

    capabilities = frozenset({Capability.TRANSACTIONS, Capability.WAITING, Capability.LISTENING})
    """A SQL store whose waiting twins are woken by LISTEN/NOTIFY (P10); one on the
    application's own connection, or on a pool whose connection parameters are
    computed, has no connection of its own to listen on: it polls, and its own
    ``capabilities`` leave LISTENING out."""

    def __init__(
        self,
        target: str | psycopg_pool.AsyncConnectionPool[Any] | psycopg.AsyncConnection[Any],
        *,
        max_size: int = 10,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT,
        require_synchronous_standby: bool = False,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        source: _AsyncPoolSource | AsyncSingleSource[AsyncPostgresConnection]
        statement_timeout = check_statement_timeout(statement_timeout)
        if isinstance(target, str):
            name = pool_name()
            breaker = Breaker(name)
            pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
                target,
                min_size=1,
                max_size=max_size,
                timeout=connect_timeout,
                kwargs=connection_options(connect_timeout, statement_timeout),
                configure=_configure_async(
                    session_settings(statement_timeout),
                    require_synchronous_standby=require_synchronous_standby,
                    breaker=breaker,
                ),
                open=False,
                name=name,
                # Give up at once on a failed connection attempt (the breaker then
                # fails requests fast and probes): the pool's own backoff would
                # leave it short of connections long after the server is back.
                reconnect_timeout=0,
                reconnect_failed=breaker.reconnect_failed,
            )
            watchdog = None if statement_timeout is None else Watchdog(statement_timeout)
            source = _AsyncPoolSource(pool, owned=True, breaker=breaker, watchdog=watchdog)
        elif isinstance(target, psycopg_pool.AsyncConnectionPool):
            source = _AsyncPoolSource(target, owned=False)
        else:
            source = AsyncSingleSource(AsyncPostgresConnection(target))
        super().__init__(
            source,
            PostgresDialect(),
            instrumentation=instrumentation,
            # Operations on the application's one connection take turns on it anyway.
            batch=isinstance(source, _AsyncPoolSource),
        )
        self._listener = listener(AsyncListener, self._dialect, target, connect_timeout)
        if self._listener is None:
            self.capabilities = self.capabilities - {Capability.LISTENING}

    async def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        """P10: return as soon as a NOTIFY says the key settled, or after ``seconds``.

        The notifications come on one connection of the store's own, opened at the
        first wait (see `idempotence.stores._listener`). A store on the
        application's one connection has none, and sleeps ``seconds``.
        """
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
