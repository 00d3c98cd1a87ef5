"""The SQL key stores: one method per operation (DESIGN 4, 6).

The store only chooses a connection and a transaction and hands the operation from
`ops` to it; the logic lives in the ops and the dialect.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, TypeVar

from ..._concurrency import sleep_async
from ...observability import Instrumentation, combine, fenced, watched_claim
from ...states import Claim, ClaimRequest, KeyRecord, KeyStatus, Lease, StagedJob, StoredResponse
from ..capabilities import Capability
from . import ops as _ops
from .batcher import AsyncBatcher
from .connection_async import AsyncConnection, AsyncSource
from .gate import ENDED, Gate, refuse_ended
from .ops import Dialect, Op, Query, Row
from .retry import TRANSIENT_ATTEMPTS, KeyHeld, TransientError, backoff

T = TypeVar("T")


async def retried_async(attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``, run again after a transient abort (a deadlock, a serialization
    failure, a busy database: [`TransientError`][idempotence.stores.TransientError]),
    at most `TRANSIENT_ATTEMPTS` times, with a jittered backoff between; the last
    attempt's error is raised. Only for work the library owns from its start to its
    commit, each attempt in a transaction of its own: the store's own operations, the
    enqueuer's batch."""
    for tried in range(TRANSIENT_ATTEMPTS):
        try:
            return await attempt()
        except TransientError:
            if tried == TRANSIENT_ATTEMPTS - 1:
                raise
            await sleep_async(backoff(tried))
    raise AssertionError("unreachable")


class AsyncTransaction:
    """An open write transaction on the store's database (R2).

    The application writes through
    [`connection`][idempotence.stores.sql.AsyncTransaction.connection] (the driver's own
    connection) or [`execute`][idempotence.stores.sql.AsyncTransaction.execute];
    [`AsyncStore.checkpoint`][idempotence.stores.sql.AsyncStore.checkpoint] or
    [`AsyncStore.finish`][idempotence.stores.sql.AsyncStore.finish] given this
    transaction is its last statement, and the whole lot commits or rolls back together.

    It is usable inside its block only: afterwards every use
    ([`execute`][idempotence.stores.sql.AsyncTransaction.execute],
    [`connection`][idempotence.stores.sql.AsyncTransaction.connection], ``tx=`` on the
    store's operations) raises [`TransactionEnded`][idempotence.errors.TransactionEnded]
    at the call; `claim` stays readable.
    """

    def __init__(self, conn: AsyncConnection, dialect: Dialect, claim: Claim | None = None) -> None:
        self._conn = conn
        self._dialect = dialect
        #: The outcome of the claim the transaction opened with
        #: (``store.transaction(claim=...)``), else None.
        self.claim = claim

    @property
    def connection(self) -> Any:
        """The driver's connection: ``psycopg.AsyncConnection`` or ``sqlite3.Connection``.

        The transaction is the store's: run statements on it (nested ``transaction()``
        blocks become savepoints), but never commit or roll it back yourself."""
        return self._conn.raw

    async def execute(self, sql: str, params: Any = None) -> list[Row]:
        """Run one statement of the application's in this transaction; return its rows
        (dicts).

        Write parameters as ``:name`` with a mapping: that works on every SQL store (on
        PostgreSQL they become psycopg's ``%(name)s``, outside string literals, comments
        and ``::`` casts, with every ``%`` in the statement then doubled for psycopg;
        see [`to_pyformat`][idempotence.stores.sql.to_pyformat]). The driver's own
        styles keep working too (``?`` on SQLite; ``%(name)s`` and ``%s`` on
        PostgreSQL), but a statement in them runs on that database only, and one that
        mixes ``:name`` with ``%(name)s`` raises
        [`MixedPlaceholders`][idempotence.errors.MixedPlaceholders].

        ```python
        await tx.execute(
            "INSERT INTO transfers (account, amount) VALUES (:account, :amount)",
            {"account": "acct_1", "amount": 2000},
        )
        ```
        """
        return await self._conn.fetch(self._dialect.application(sql, params))

    def _fenced(self, lease: Lease, operation: str, instrumentation: Any) -> AsyncConnection:
        """The connection for a fenced write of ``lease`` in this transaction, refused
        first if the block has ended (TransactionEnded: the caller's bug, not a lost
        lock), then if the transaction's claim wrote that key finished (LockLost,
        reported as any refused fenced write)."""
        conn = self._conn
        if conn is ENDED:
            refuse_ended()
        _ops.refuse_after_finished_claim(self.claim, lease, operation, instrumentation)
        return conn


def _no_commit(at_commit: bool) -> None:
    if at_commit:
        raise ValueError("finish(at_commit=True) needs the transaction to commit with: tx=")


class AsyncStore:
    """A key store on a SQL database. Build one with
    [`AsyncPostgresStore`][idempotence.stores.postgres.AsyncPostgresStore] or
    [`AsyncSqliteStore`][idempotence.stores.sqlite.AsyncSqliteStore]; their
    ``instrumentation`` keyword
    ([`idempotence.observability`][idempotence.observability]) is told of every claim,
    every refused fenced write, and the runs of the flows on the store.

    ```python
    claim = await store.claim(ClaimRequest(scope="acct_1", key="k1", fingerprint=fp))
    if claim.outcome is Outcome.EXECUTE:
        async with store.transaction() as tx:
            await tx.execute("INSERT INTO rides ...")
            await store.finish(claim.lease, StoredResponse.of(201, body="{}"), tx=tx)
    ```

    While a thread (or, async, a task) has the store's
    [`transaction`][idempotence.stores.sql.AsyncStore.transaction] open, the store's
    operations there take ``tx=`` (claim, finish) or wait for the transaction to end:
    one that would need a connection of its own (any operation without ``tx=``, a second
    ``transaction()``) raises
    [`StoreInTransaction`][idempotence.errors.StoreInTransaction] at once, on every
    store, rather than wait for the transaction that waits for it. After
    [`close`][idempotence.stores.sql.AsyncStore.close], every operation raises
    [`StoreUnavailable`][idempotence.errors.StoreUnavailable].
    """

    _transaction_type: type[AsyncTransaction] = AsyncTransaction
    """What [`transaction`][idempotence.stores.sql.AsyncStore.transaction] yields (a
    store on an ORM's connections adds its session)."""

    capabilities: frozenset[Capability] = frozenset({Capability.TRANSACTIONS, Capability.WAITING})
    """What the store can do beyond the key-store operations
    ([`capabilities_of`][idempotence.stores.capabilities.capabilities_of]): a SQL store
    shares its transactions with the application (R2, F3), and holds a duplicate
    waiting for its twin by polling (P10: the
    [`wait_for_settle`][idempotence.stores.sql.AsyncStore.wait_for_settle] below).
    A store woken by its database adds
    [`LISTENING`][idempotence.stores.capabilities.Capability.LISTENING]. A class
    attribute, but an instance may say otherwise in its own."""

    def __init__(
        self,
        source: AsyncSource,
        dialect: Dialect,
        *,
        instrumentation: Instrumentation | None = None,
        batch: bool = False,
    ) -> None:
        self._source = source
        self._dialect = dialect
        # A disabled instrumentation (its package missing) is dropped: None costs nothing.
        self._instrumentation = combine(instrumentation)
        self._gate = Gate()
        #: Claims and finishes outside a transaction, batched while one is out
        #: (DESIGN 11): on a pool of the dialect's one-statement claims only.
        self._batcher = (
            AsyncBatcher(self._own, self._send_batch)
            if batch and dialect.claim_is_one_statement
            else None
        )

    async def claim(self, request: ClaimRequest, *, tx: AsyncTransaction | None = None) -> Claim:
        """Claim ``request``'s key in one atomic step and return its single outcome.

        Given ``tx``, the claim joins that transaction (request-as-transaction, F3): a
        racing duplicate's ``transaction(claim=...)`` is then told IN_PROGRESS (F8),
        while a claim joining a transaction of its own this way waits for it to commit
        and replays its response (its lock wait is not bounded).
        """
        if self._instrumentation is not None:
            with self._instrumentation.claim(request) as watch:
                return watch.done(await self._claim(request, tx))
        return await self._claim(request, tx)

    async def _claim(self, request: ClaimRequest, tx: AsyncTransaction | None) -> Claim:
        if tx is not None:
            return await tx._conn.run_in_transaction(self._dialect.claim(request))
        if self._dialect.previews_claims:
            # Replays, mismatches and conflicts are decided by a read, without the
            # write lock; only a claim that may take the key goes on to write.
            preview = await self._own(
                lambda: _ops.claim_preview(self._dialect, request), write=False
            )
            if preview is not None:
                return preview
        if self._batcher is not None:
            # Here, not only in _own: a claim that joins a queue never reaches its own
            # _own, and inside this store's transaction it must fail at once, not run
            # in a batch on another connection (StoreInTransaction).
            self._gate.check()
            return await self._batcher.run(
                "claim", request.scope, lambda: self._dialect.claim(request)
            )
        return await self._own(
            lambda: self._dialect.claim(request), atomic=not self._dialect.claim_is_one_statement
        )

    def transaction(
        self, *, claim: ClaimRequest | None = None, finished: StoredResponse | None = None
    ) -> AbstractAsyncContextManager[AsyncTransaction]:
        """Open a write transaction for a phase: commits on exit, rolls back on error.

        Given ``claim``, the transaction opens with that claim (request-as-transaction,
        F3), sent with the BEGIN where the driver can; its outcome is ``tx.claim``. A
        racing duplicate does not wait for this transaction (F8): on PostgreSQL its
        claim gives up the row lock after a moment, rolls back, and is answered from
        the key's last committed version (a replay, a mismatch, or IN_PROGRESS with
        ``held``); then ``tx`` has no transaction open and must not be written to.

        Given ``finished`` as well (a run whose stored response is known before it runs:
        a transactional consumer's), a claim that takes the key writes it finished with
        that response at once: the commit settles it with everything else, a rollback
        takes it back, and no [`finish`][idempotence.stores.sql.AsyncStore.finish]
        follows (one would be refused: the key is finished). Its ``finished_at`` is the
        claim's time.
        """
        return _AsyncTransactionBlock(self, claim, finished)

    async def checkpoint(
        self,
        tx: AsyncTransaction,
        lease: Lease,
        recovery_point: str,
        *,
        calling: str | None = None,
    ) -> Lease:
        """Record ``recovery_point`` in ``tx``, fenced (F1); returns the advanced lease.

        ``calling`` names the non-idempotent foreign call about to begin, so that a
        claim after a crash knows it may have happened (R6); every checkpoint without it
        clears it. Raises [`LockLost`][idempotence.maintenance.completer_async.LockLost]
        when another worker holds the key now; the caller must then let ``tx`` roll
        back.
        """
        conn = tx._fenced(lease, "checkpoint", self._instrumentation)
        op = _ops.checkpoint(self._dialect, lease, recovery_point, calling)
        return await conn.run_in_transaction(fenced(self._instrumentation, "checkpoint", op))

    async def finish(
        self,
        lease: Lease,
        response: StoredResponse,
        *,
        tx: AsyncTransaction | None = None,
        error: str | None = None,
        at_commit: bool = False,
    ) -> None:
        """Store ``response`` and unlock, fenced; in ``tx`` when given (R2).

        ``error`` marks the key errored (R6): terminal and listed for a human. With
        ``at_commit`` the finish waits for ``tx`` to commit and is its last statement,
        sent with the COMMIT where the driver can: then a refused write (LockLost)
        comes out of the transaction's exit, with everything in it rolled back.
        """
        if tx is None:
            _no_commit(at_commit)
            op = functools.partial(_ops.finish, self._dialect, lease, response, error)
            await self._finish_own(lease, op)
            return
        conn = tx._fenced(lease, "finish", self._instrumentation)
        finish = fenced(
            self._instrumentation, "finish", _ops.finish(self._dialect, lease, response, error)
        )
        if at_commit:
            conn.defer(finish)
        else:
            await conn.run_in_transaction(finish)

    async def _finish_own(self, lease: Lease, op: Callable[[], Op[T]]) -> T:
        """A finish outside any transaction: batched while another is out (DESIGN 11)."""
        if self._batcher is not None:
            self._gate.check()  # as in claim: a queued finish never reaches _own
            return await self._batcher.run(
                "finish", lease.scope, lambda: fenced(self._instrumentation, "finish", op())
            )
        return await self._own(lambda: fenced(self._instrumentation, "finish", op()))

    async def _finish_times(
        self, lease: Lease, response: StoredResponse, error: str | None
    ) -> tuple[datetime, datetime | None]:
        """[`finish`][idempotence.stores.sql.AsyncStore.finish] outside a transaction,
        batched as it is, handing back the finished row's ``finished_at`` and
        ``expires_at`` (the database's times): with the claim's record, what a cache in
        front of the store keeps for replays
        ([`AsyncCachedStore`][idempotence.stores.cached.AsyncCachedStore])."""
        return await self._finish_own(
            lease, functools.partial(_ops.finish_times, self._dialect, lease, response, error)
        )

    async def _invalidate(self, scope: str, key: str, key_id: int) -> None:
        """Before and after the key row ``key_id`` is deleted by an operator
        ([`evict_key`][idempotence.maintenance.admin.evict_key]): a store with a cache in
        front forgets the row's cached response there. A plain store has nothing to do."""

    async def release(self, lease: Lease) -> None:
        """Unlock without finishing, fenced: the next claim resumes (R5)."""
        await self._own(
            lambda: fenced(self._instrumentation, "release", _ops.release(self._dialect, lease))
        )

    async def heartbeat(self, lease: Lease) -> datetime:
        """Extend the lock by its timeout from now, fenced (F2)."""
        return await self._own(
            lambda: fenced(self._instrumentation, "heartbeat", _ops.heartbeat(self._dialect, lease))
        )

    async def end_phase(
        self,
        tx: AsyncTransaction,
        lease: Lease,
        *,
        jobs: Sequence[tuple[str, str, Any]] = (),
        recovery_point: str | None = None,
        response: StoredResponse | None = None,
    ) -> Lease:
        """Close a phase in ``tx``: stage ``jobs``, then store ``response`` or
        checkpoint ``recovery_point`` (the same one when None), fenced."""
        operation = "checkpoint" if response is None else "finish"
        conn = tx._fenced(lease, operation, self._instrumentation)
        op = _ops.end_phase(self._dialect, lease, list(jobs), recovery_point, response)
        return await conn.run_in_transaction(fenced(self._instrumentation, operation, op))

    async def forget(self, lease: Lease) -> None:
        """Delete a key still at ``started``, fenced: a rejected request stores nothing (R5)."""
        await self._own(
            lambda: fenced(self._instrumentation, "forget", _ops.forget(self._dialect, lease))
        )

    async def stage_jobs(
        self, tx: AsyncTransaction, lease: Lease, jobs: list[tuple[str, str, Any]]
    ) -> None:
        """Stage ``(job_key, name, args)`` jobs in ``tx``; they commit with it (R7)."""
        await tx._conn.run_in_transaction(_ops.stage_jobs(self._dialect, lease, jobs))

    async def take_staged_jobs(self, tx: AsyncTransaction, limit: int = 100) -> list[StagedJob]:
        """Take up to ``limit`` staged jobs out of the table in ``tx`` (the enqueuer's
        batch: commit ``tx`` only once they are delivered)."""
        return await tx._conn.run_in_transaction(_ops.take_staged_jobs(self._dialect, limit))

    async def get(self, scope: str, key: str) -> KeyRecord | None:
        """The key's current record, or None."""
        return await self._own(lambda: _ops.get(self._dialect, scope, key), write=False)

    async def key_status(self, scope: str, key: str) -> KeyStatus | None:
        """The key's state on the database clock, with its times and its stored
        status code (never its body); None for a key the store does not hold.

        A finished key whose retention has passed is EXPIRED at once, before the
        reaper deletes it; it still replays until then (B3).

        ```python
        status = await store.key_status("acct_1", "k1")
        status.state, status.response_status
        # (<KeyState.COMPLETE: 'complete'>, 201)
        ```
        """
        return await self._perform(lambda d: _ops.key_status(d, scope, key), write=False)

    async def wait_for_settle(self, scope: str, key: str, seconds: float) -> None:
        """Wait up to ``seconds`` for another request's claim on the key to
        settle (finish, release): P10's wait for the twin, between two claims.

        It may return early, and returns having learnt nothing: the caller claims
        again to find out. This default sleeps ``seconds`` (bounded polling, as on
        SQLite); the PostgreSQL store returns as soon as a NOTIFY says the key
        settled. It never raises for a store failure: the next claim reports it.

        ```python
        while (claim := await store.claim(request)).outcome is Outcome.IN_PROGRESS:
            await store.wait_for_settle(request.scope, request.key, 0.25)
        ```
        """
        await sleep_async(seconds)

    @property
    def instrumentation(self) -> Instrumentation | None:
        """What the store and the flows run on it report to, or None
        ([`idempotence.observability`][idempotence.observability])."""
        return self._instrumentation

    async def _perform(
        self,
        make_op: Callable[[Dialect], Op[T]],
        *,
        tx: AsyncTransaction | None = None,
        write: bool = True,
    ) -> T:
        """Run one of the library's own store operations (a generator of queries over
        the store's dialect, which ``make_op`` is handed).

        In ``tx`` when given. Otherwise in a transaction of its own (``write``) or as a
        plain read, retried after a transient abort, which is why this takes a factory:
        each attempt gets a fresh operation. Not public API: it is how the background
        services ([`idempotence.maintenance`][idempotence.maintenance]) reach the
        store's SQL.
        """
        if tx is not None:
            return await tx._conn.run_in_transaction(make_op(self._dialect))
        return await self._own(lambda: make_op(self._dialect), atomic=write, write=write)

    async def migrate(self) -> list[str]:
        """Apply pending schema migrations; return the versions applied."""
        return await self._own(lambda: _ops.migrate(self._dialect), atomic=True)

    async def close(self) -> None:
        """Close the connections the store opened itself; every later operation raises
        [`StoreUnavailable`][idempotence.errors.StoreUnavailable] (an application's pool or
        connection stays open). Closing twice is harmless."""
        self._gate.close()
        await self._source.close()

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send_batch(self, queries: list[Query]) -> list[list[Row]]:
        """Send statements of one kind and scope as one (see `batcher`)."""
        return await self._own(lambda: _ops.batch(self._dialect, queries))

    async def _own(
        self, make_op: Callable[[], Op[T]], *, atomic: bool = False, write: bool = True
    ) -> T:
        """Run an operation in a transaction of its own, retrying transient aborts."""
        self._gate.check()

        async def attempt() -> T:
            async with self._source.connection() as conn:
                return await conn.perform(make_op(), atomic=atomic, write=write)

        return await retried_async(attempt)


class _AsyncTransactionBlock:
    """The block of [`AsyncStore.transaction`][idempotence.stores.sql.AsyncStore.transaction]:
    the store's gate, a connection of its source, and the connection's atomic block
    (or, for a claim that found its key held, the read that answers it instead, F8),
    entered and exited by hand, in the order and with the errors that nested blocks
    would give them. A class, not a generator: it is entered for every phase and every
    request-as-transaction, and a generator's block costs a generator, its wrapper and
    two more calls each time. A block that swallows an error is honoured as the
    statement would honour it (none of the library's does)."""

    __slots__ = ("_atomic", "_claim", "_finished", "_gate", "_source", "_store", "_tx")

    def __init__(
        self, store: AsyncStore, claim: ClaimRequest | None, finished: StoredResponse | None
    ) -> None:
        self._store = store
        self._claim = claim
        self._finished = finished
        self._atomic: AbstractAsyncContextManager[Any] | None = None

    async def __aenter__(self) -> AsyncTransaction:
        store, claim = self._store, self._claim
        if self._finished is not None and claim is None:
            raise ValueError("transaction(finished=...) needs the claim it finishes: claim=")
        dialect = store._dialect
        # A block entered again (the same store.transaction() object) is a transaction
        # of its own: nothing of the last one's is exited with it.
        self._atomic = None
        gate = self._gate = store._gate.transaction()
        gate.__enter__()
        try:
            source = self._source = store._source.connection()
            conn = await source.__aenter__()
            try:
                op = None
                if claim is not None:
                    claimed = dialect.claim(claim, self._finished)
                    op = watched_claim(store._instrumentation, claim, claimed)
                atomic: AbstractAsyncContextManager[Any] | None
                try:
                    atomic = conn.atomic(op)
                    got = await atomic.__aenter__()
                except KeyHeld:
                    if claim is None:
                        raise
                    atomic = None  # the claim found its key held (F8): read below
                if atomic is None:
                    assert claim is not None  # only a claim finds its key held
                    held = await conn.perform(
                        _ops.claim_held(dialect, claim), atomic=False, write=False
                    )
                    tx = store._transaction_type(conn, dialect, held)
                else:
                    try:
                        tx = store._transaction_type(conn, dialect, got)
                    except BaseException as exc:
                        if not await atomic.__aexit__(type(exc), exc, exc.__traceback__):
                            raise
                        tx = None
                    else:
                        self._atomic = atomic
            except BaseException as exc:
                if not await source.__aexit__(type(exc), exc, exc.__traceback__):
                    raise
                tx = None
            else:
                if tx is None:
                    await source.__aexit__(None, None, None)
            if tx is None:  # a block swallowed the error of its start: no transaction
                raise RuntimeError("the transaction's block did not open") from None
        except BaseException as exc:
            gate.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._tx = tx
        return tx

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        # Ended as the block ends, before the COMMIT (and what was deferred to it) and
        # the connection's return: from now on nothing runs through this tx (see
        # gate.ENDED).
        self._tx._conn = ENDED
        atomic = self._atomic
        try:
            try:
                if atomic is not None and await atomic.__aexit__(kind, exc, tb):
                    kind = exc = tb = None
            except BaseException as error:  # the COMMIT failed, or the rollback
                if not await self._source.__aexit__(type(error), error, error.__traceback__):
                    raise
                kind = exc = tb = None
            else:
                if await self._source.__aexit__(kind, exc, tb):
                    kind = exc = tb = None
        except BaseException as error:
            self._gate.__exit__(type(error), error, error.__traceback__)
            raise
        self._gate.__exit__(kind, exc, tb)
        return exc is None  # True: swallowed by a block (or no error at all)
