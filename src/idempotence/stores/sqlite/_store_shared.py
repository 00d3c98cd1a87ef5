"""The SQLite store's parts shared by the sync and the async store: the dialect, error
translation, a connection and its group commit (see `sqlite`)."""

from __future__ import annotations

import contextlib
import contextvars
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import (
    AbstractContextManager,
    contextmanager,
    nullcontext,
)
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from ...errors import ConfigurationError, SchemaMissing, StoreError, StoreUnavailable
from ...states import ClaimRequest, StoredResponse
from .._sql.connection import body, run
from .._sql.ops import APPLICATION, Dialect, Op, Query, Row, claim_in_transaction
from .._sql.retry import Blocks, TransientError, own_copy, translator
from .._sql.transactions import TransactionStatements
from ._group import Groups

DEFAULT_BUSY_TIMEOUT = 5.0
"""Seconds a connection waits for another's write lock before the attempt fails (and
the store retries it a few times, see ``_sql.store.TRANSIENT_ATTEMPTS``)."""

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
"""The values of ``PRAGMA synchronous`` a store accepts (``None`` keeps SQLite's
default, FULL). In WAL mode NORMAL skips the fsync at each commit: a commit is
still atomic and the database consistent, but the last commits before a power
loss or an OS crash may be rolled back (an application crash loses nothing)."""

MAX_IDLE_CONNECTIONS = 16
"""Idle connections a store keeps open for reuse (and, async, the most it opens)."""

T = TypeVar("T")

_DURATIONS: dict[Any, timedelta] = {}
_MOMENTS: dict[Any, datetime] = {}


class SqliteDialect(Dialect):
    name = "sqlite"
    claim_is_one_statement = False
    previews_claims = True
    # IMMEDIATE takes the write lock now, so the claim's read and write are one
    # serializable unit (P6), and a phase never deadlocks upgrading a read lock.
    begin_statement = "BEGIN IMMEDIATE"

    @classmethod
    def savepoint_statements(cls, name: str) -> TransactionStatements:
        # SQLite's ROLLBACK TO leaves the savepoint open: it is released as well.
        plain = super().savepoint_statements(name)
        return replace(plain, rollback=(*plain.rollback, plain.commit))

    def timestamp(self, value: Any) -> datetime:
        # A claim's row holds one time three or four times (its 'now' is the
        # statement's: created_at, locked_at, last_run_at, db_now): each is made once.
        moment = _MOMENTS.get(value)
        if moment is None:
            if len(_MOMENTS) >= 16:
                _MOMENTS.clear()
            moment = _MOMENTS[value] = datetime.fromtimestamp(float(value), UTC)
        return moment

    def duration_in(self, value: timedelta | None) -> Any:
        return None if value is None else value.total_seconds()

    def duration_out(self, value: Any) -> timedelta:
        # A key's lock timeout is one of the few an application sets: each is made once
        # (a timedelta from float seconds costs more than the rest of the column).
        duration = _DURATIONS.get(value)
        if duration is None:
            if len(_DURATIONS) >= 64:
                _DURATIONS.clear()
            duration = _DURATIONS[value] = timedelta(seconds=float(value))
        return duration

    def claim(self, request: ClaimRequest, finished: StoredResponse | None = None) -> Op[Any]:
        return claim_in_transaction(self, request, finished)

    def script_statements(self, script: str) -> list[str]:
        # sqlite3 runs one statement per execute(), and executescript() would commit
        # the migrating transaction first.
        statements, pending = [], ""
        for line in script.splitlines(keepends=True):
            pending += line
            if sqlite3.complete_statement(pending):
                statements.append(pending.strip())
                pending = ""
        if pending.strip() and not all(
            part.strip().startswith("--") or not part.strip() for part in pending.splitlines()
        ):
            raise ValueError(f"incomplete statement at the end of a migration: {pending!r}")
        return statements


def translate(exc: sqlite3.Error, *, own: bool = True) -> StoreError:
    """The library's error for a sqlite3 error (the caller raises it ``from``);
    ``own`` is False for the application's statement (a table missing is then not
    the key store's)."""
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError):
        if "locked" in text or "busy" in text:
            return TransientError(f"SQLite is busy: {text}")
        if own and ("no such table" in text or "no such column" in text):
            # No table, or one from an older release: the migrations have not run.
            return SchemaMissing(
                f"The key store's schema is missing or older than this release ({text}): "
                "run `idempotence migrate --database URL`"
            )
        if "unable to open" in text or "disk I/O" in text or "readonly" in text:
            return StoreUnavailable(f"SQLite database is unavailable: {text}")
    return StoreError(f"SQLite error: {text}")


_translated = translator(sqlite3.Error, translate)
"""``with _translated(query.name):`` raises the library's error for a sqlite3 error."""


class SqliteConnection:
    """A [`Connection`][idempotence.stores.sql.Connection] on one sqlite3 connection
    (opened by `connect`): the store's statements, its transactions as
    ``BEGIN IMMEDIATE`` or a savepoint, and the statements deferred to their commit.

    Args:
        raw: the sqlite3 connection, in autocommit (``isolation_level=None``).
        writer: held around every write transaction, so a store's threads queue for
            SQLite's one writer instead of polling its busy handler.
        groups: the group commit of a file's connections, if any.
    """

    def __init__(
        self,
        raw: sqlite3.Connection,
        writer: AbstractContextManager[Any] | None = None,
        groups: _ThreadGroups | None = None,
    ) -> None:
        self.raw = raw
        # SQLite admits one writer at a time. Threads of one store queue on this lock
        # and wake the moment it is free; left to SQLite's busy handler they would
        # sleep in growing steps (up to 100 ms) and throughput would collapse.
        self._writer = writer if writer is not None else nullcontext()
        self._blocks = Blocks()
        # Group commit for the store's own autocommit writes (a file's connections).
        self._groups = groups
        # One cursor for the statements (raw.execute would make one per statement).
        self._cursor: sqlite3.Cursor | None = None

    def fetch(self, query: Query) -> list[Row]:
        # A try costs nothing until a statement fails; `with translated()`, three calls.
        cur = self._cursor
        try:
            if cur is None:
                cur = self._cursor = self.raw.cursor()
            rows = cur.execute(query.sql, query.params).fetchall()
            description = cur.description
        except sqlite3.Error as exc:
            # A statement stopped half-way keeps its read open until reset: the next
            # statement gets a new cursor and this one lets it go.
            self._cursor = None
            if cur is not None:
                with contextlib.suppress(sqlite3.Error):
                    cur.close()
            raise translate(exc, own=query.name != APPLICATION) from exc
        if not description:
            return []
        # Read at every statement, the store's own too: `k.*` follows the table, which
        # a migration may change under a running app (even to as many columns).
        names = [column[0] for column in description]
        if len(rows) == 1:  # most statements: no comprehension's frame
            return [dict(zip(names, rows[0], strict=True))]
        return [dict(zip(names, row, strict=True)) for row in rows]

    @contextmanager
    def atomic(self, first: Op[T] | None = None) -> Iterator[T | None]:
        statements = SqliteDialect.transaction_statements(nested=self.raw.in_transaction)
        with self._writer if not self.raw.in_transaction else nullcontext():
            with _translated():
                self.raw.execute(statements.begin)
            try:
                with body(self._blocks, self, first) as result:
                    yield result
            except BaseException:
                with _translated():
                    for statement in statements.rollback:
                        self.raw.execute(statement)
                raise
            with _translated():
                self.raw.execute(statements.commit)

    def defer(self, op: Op[Any]) -> None:
        self._blocks.defer(op)

    def perform(self, op: Op[T], *, atomic: bool, write: bool) -> T:
        if self._groups is not None and (atomic or write) and not self.raw.in_transaction:
            return self._groups.write(self, op, atomic=atomic)
        return self.perform_alone(op, atomic=atomic, write=write)

    def perform_alone(self, op: Op[T], *, atomic: bool, write: bool) -> T:
        with self.atomic() if atomic else self.unit(write=write):
            return run(op, self)

    def commit_group(self, group: Sequence[_Write[Any]]) -> None:
        """Run the writes of ``group`` in one transaction and commit it, settling
        each write with its own result or error.

        Each write runs in a savepoint of its own, so one that fails (a refused
        fenced write, a constraint, a bad parameter) rolls back alone and the others
        commit. Nothing is settled as done before the COMMIT returned: a caller is
        never told of a write that is not durable. A group of one runs exactly as
        the write would alone (no savepoint).
        """
        if len(group) == 1:
            (alone,) = group
            try:
                alone.result = alone.context.run(
                    self.perform_alone, alone.op, atomic=alone.atomic, write=True
                )
            except Exception as exc:
                alone.error = exc
            return
        with self._writer:
            try:
                with _translated():
                    self.raw.execute("BEGIN IMMEDIATE")
            except StoreError as exc:
                _fail(group, exc)  # busy: each caller's store retries its own write
                return
            try:
                for index, write in enumerate(group):
                    if not self._run_in_savepoint(write):
                        # SQLite rolled the whole transaction back (a full disk, an
                        # I/O error): the writes before this one are undone too.
                        lost = TransientError(f"a write in the same commit failed: {write.error!r}")
                        _fail(group[:index], lost)
                        _fail(group[index + 1 :], lost)
                        return
                with _translated():
                    self.raw.execute("COMMIT")
            except BaseException as exc:
                interrupted = exc if isinstance(exc, Exception) else _interrupted(exc)
                # Settled before the rollback: a rollback that fails as well must not
                # leave a write holding the result of a savepoint that never committed.
                _fail(group, interrupted)
                if self.raw.in_transaction:
                    self.raw.rollback()
                if interrupted is not exc:
                    raise

    def _run_in_savepoint(self, write: _Write[Any]) -> bool:
        """Run ``write`` in a savepoint, kept on success and undone on its error;
        False when its error ended the whole transaction."""
        with _translated():
            self.raw.execute("SAVEPOINT idempotence_group")
        try:
            write.result = write.context.run(run, write.op, self)
        except Exception as exc:
            write.error = exc
            if not self.raw.in_transaction:
                return False
            with _translated():
                self.raw.execute("ROLLBACK TO idempotence_group")
        with _translated():
            self.raw.execute("RELEASE idempotence_group")
        return True

    def run_in_transaction(self, op: Op[T]) -> T:
        return run(op, self)

    def unit(self, *, write: bool = True) -> AbstractContextManager[None]:
        if self.raw.in_transaction:
            return nullcontext()
        # An application's connection in the legacy implicit-transaction mode would
        # leave our statement uncommitted, so it gets an explicit transaction.
        if self.raw.isolation_level is not None:
            return self.atomic()
        # Our own connections autocommit; a write still queues for the writer lock
        # (see __init__), or it would sleep in the busy handler while holding up the
        # thread that has the lock.
        return self._writer if write else nullcontext()


class _Write(Generic[T]):
    """One of the store's own autocommit writes, waiting for its group's commit."""

    __slots__ = ("atomic", "context", "error", "op", "result")

    def __init__(self, op: Op[T], *, atomic: bool) -> None:
        self.op = op
        self.atomic = atomic
        # It runs in its caller's context wherever it runs: a refused fenced write
        # reports to the caller's trace span, not the committer's.
        self.context = contextvars.copy_context()
        self.result: Any = _UNSET
        self.error: Exception | None = None

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        if self.result is _UNSET:  # its committer was interrupted before it knew
            raise _interrupted(None)
        result: T = self.result
        return result


_UNSET = object()


def _interrupted(exc: BaseException | None) -> StoreError:
    return StoreError(
        f"the commit of this write was interrupted ({exc!r}): it may or may not have committed"
    )


def _fail(writes: Sequence[_Write[Any]], error: Exception) -> None:
    """Settle every write of ``writes`` not yet failed with its own error as failed
    with ``error`` (a copy each: callers on other threads raise it at once)."""
    for write in writes:
        write.op.close()
        if write.error is None:
            write.error = own_copy(error)


class _ThreadWrite(_Write[T]):
    __slots__ = ("leads", "wake")

    def __init__(self, op: Op[T], *, atomic: bool) -> None:
        super().__init__(op, atomic=atomic)
        self.wake = threading.Event()
        #: Woken to commit the next group (not with an outcome).
        self.leads = False


class _ThreadGroups:
    """Group commit for threads: a thread that writes while no commit is in flight
    commits at once, on its own connection, everything queued by then; the threads
    that write meanwhile wait for their outcome, or to be woken to commit the next
    group (the first of them)."""

    def __init__(self) -> None:
        self._groups: Groups[_ThreadWrite[Any]] = Groups()
        self._lock = threading.Lock()

    def write(self, conn: SqliteConnection, op: Op[T], *, atomic: bool) -> T:
        with self._lock:
            alone = self._groups.lead()
        if alone:
            # The idle database's write, the common case: it runs on this thread as
            # it would without group commit, with no queue entry or event to build.
            try:
                return conn.perform_alone(op, atomic=atomic, write=True)
            finally:
                self._hand_over()
        write = _ThreadWrite(op, atomic=atomic)
        with self._lock:
            leads = self._groups.arrive(write)
        if not leads:
            write.wake.wait()
            if not write.leads:
                return write.outcome()
        with self._lock:
            group = self._groups.take()
        try:
            conn.commit_group(group)
        finally:
            self._hand_over()
            for other in group:
                if other is not write:
                    other.wake.set()
        return write.outcome()

    def _hand_over(self) -> None:
        """The commit in flight has ended: wake the first write queued meanwhile to
        commit the next group."""
        with self._lock:
            following = self._groups.done()
        if following is not None:
            following.leads = True
            following.wake.set()


def connect(
    path: str, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT, synchronous: str | None = None
) -> sqlite3.Connection:
    """Open a connection configured the way the store needs it."""
    level = _synchronous(synchronous)
    with _translated():
        raw = sqlite3.connect(
            path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("PRAGMA foreign_keys=ON")
        if level is not None:
            raw.execute(f"PRAGMA synchronous={level}")
    return raw


def _synchronous(value: str | None) -> str | None:
    """``value`` checked against `SYNCHRONOUS` (it is spliced into a PRAGMA)."""
    if value is None:
        return None
    if not isinstance(value, str) or value.upper() not in SYNCHRONOUS:
        raise ConfigurationError(
            f"synchronous={value!r}: use one of {', '.join(SYNCHRONOUS)} (or None for "
            "SQLite's default, FULL)"
        )
    return value.upper()


def _check_synchronous(target: str | sqlite3.Connection, synchronous: str | None) -> None:
    """Refuse ``synchronous`` when it is bad or cannot apply, when the store is built
    (not at its first connection)."""
    _synchronous(synchronous)
    if synchronous is not None and isinstance(target, sqlite3.Connection):
        raise ConfigurationError(
            "synchronous= applies to the store's own connections: set the PRAGMA on "
            "the application's connection instead"
        )
