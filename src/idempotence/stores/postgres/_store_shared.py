"""What the PostgreSQL stores share, sync or async: the dialect, the translation of
psycopg's errors, the pieces of a pipelined transaction, and the pool settings.

The stores themselves are in `_store_async` (the source) and
`_store` (generated from it); `idempotence.stores.postgres` is their public face.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import psycopg
import psycopg_pool
from psycopg import pq
from psycopg.rows import RowMaker, dict_row
from psycopg.types.string import TextLoader

from ...errors import ConfigurationError, SchemaMissing, StoreError, StoreUnavailable
from ...states import ClaimRequest, StoredResponse
from .._listener import Listener
from .._listener_async import AsyncListener
from .._sql.ops import APPLICATION, Dialect, Op, Query, Row, claim_in_one_statement, new_query
from .._sql.placeholders import to_pyformat
from .._sql.retry import KeyHeld, TransientError, translator
from ._breaker import connect_errors

DEFAULT_CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a connection before the store reports itself unavailable
(P11): a request should get its 503 quickly, not after libpq's default minutes."""

DEFAULT_STATEMENT_TIMEOUT = 30.0
"""DESIGN 13: no statement or COMMIT on the request path waits without bound. Seconds a
statement may run on the server (``statement_timeout``: a row lock held by a stuck
session) and a connection may go unanswered on the network (``tcp_user_timeout``
and keepalives: a partition, a server that stopped answering mid-query) before the
store fails closed with StoreUnavailable (503). Generous: an application's
statement inside request-as-transaction mode is bounded too."""


def check_statement_timeout(seconds: float | None) -> float | None:
    """``seconds`` if it is None (no bound) or a positive number of seconds."""
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0
    ):
        raise ConfigurationError(
            f"statement_timeout is a positive number of seconds (or None for no bound), "
            f"not {seconds!r}"
        )
    return seconds


def connection_options(connect_timeout: float, statement_timeout: float | None) -> dict[str, Any]:
    """The libpq options of the store's own connections (DESIGN 13, P11).

    With a bound, the kernel drops a connection whose data stays unacknowledged for
    ``statement_timeout`` (``tcp_user_timeout``), and keepalives probe a connection
    that waits for an answer with nothing unacknowledged (the request reached the
    server, then the network broke), so psycopg's wait ends with an error instead of
    lasting for the TCP retransmission timeout (about 15 minutes).
    """
    options: dict[str, Any] = {"autocommit": True, "connect_timeout": max(int(connect_timeout), 1)}
    if statement_timeout is not None:
        options |= {
            "keepalives": 1,
            "keepalives_idle": max(int(statement_timeout / 3), 1),
            "keepalives_interval": 1,
            "keepalives_count": 3,
            "tcp_user_timeout": max(int(statement_timeout * 1000), 1),
        }
    return options


def session_settings(statement_timeout: float | None) -> str:
    """SET statements for a new connection of the store's own pool.

    The server ends a statement that runs (or waits for a lock) longer than the bound
    (QueryCanceled, translated to StoreUnavailable), and a transaction left idle that
    long: after a partition cut the app off mid-transaction (request-as-transaction
    mode), the server would otherwise hold the key row's lock until its own TCP
    keepalive notices the client gone, two hours by default.

    Neither timeout covers a session the partition cut off in the middle of a
    pipeline (the claim's BEGIN and claim went out, the Sync did not): the server
    ran the claim, holds the row, and waits for the rest of the batch, "active" and
    reading, a state no statement or idle timeout applies to. So the server's side of
    the connection gets the keepalives and the user timeout the store's side has:
    the server drops a client it cannot reach within about the bound, and the
    session rolls back.
    """
    if statement_timeout is None:
        return SESSION_PLANNING
    ms = max(int(statement_timeout * 1000), 1)
    tcp = connection_options(DEFAULT_CONNECT_TIMEOUT, statement_timeout)
    return (
        f"{SESSION_PLANNING};\nSET statement_timeout = {ms};\n"
        f"SET idle_in_transaction_session_timeout = {ms};\n"
        f"SET tcp_keepalives_idle = {tcp['keepalives_idle']};\n"
        f"SET tcp_keepalives_interval = {tcp['keepalives_interval']};\n"
        f"SET tcp_keepalives_count = {tcp['keepalives_count']};\n"
        f"SET tcp_user_timeout = {tcp['tcp_user_timeout']}"
    )


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

    def claim(self, request: ClaimRequest, finished: StoredResponse | None = None) -> Op[Any]:
        return claim_in_one_statement(self, request, finished)

    def application(self, sql: str, params: Any) -> Query:
        # psycopg takes %(name)s, not the :name every store takes (cached per text).
        return new_query(APPLICATION, to_pyformat(sql), params or {})


# -- the pools the store opens (P11) ---------------------------------------------------
#
# While the server is down, each connection attempt of a pool logs a warning
# (psycopg.pool), and so does each dead connection it discards: a line per request.
# The store's own pools report an outage once instead (see ._breaker); the pools of
# an application keep their log.
POOL_PREFIX = "idempotence-"
_pools = itertools.count(1)
_QUIET = frozenset(
    {
        "error connecting in %r: %s",
        "reconnection attempt in pool %r failed after %s sec",
        "discarding closed connection: %s",
    }
)


def pool_name() -> str:
    return f"{POOL_PREFIX}{next(_pools)}"


def _ours(thing: object) -> bool:
    name = thing if isinstance(thing, str) else getattr(getattr(thing, "_pool", None), "name", "")
    return isinstance(name, str) and name.startswith(POOL_PREFIX)


def _loud(record: logging.LogRecord) -> bool:
    args = record.args
    if record.msg in _QUIET and isinstance(args, tuple) and args and _ours(args[0]):
        if record.msg == "error connecting in %r: %s":
            connect_errors[str(args[0])] = str(args[1])  # the breaker's reason
        return False
    return True


logging.getLogger("psycopg.pool").addFilter(_loud)


def translate(exc: BaseException, *, own: bool = True) -> StoreError:
    """The library's error for a psycopg or pool error (the caller raises it ``from``);
    ``own`` is False for the application's statement (a table missing is then not
    the key store's)."""
    sqlstate = getattr(exc, "sqlstate", None) or ""
    # Class 40 is "transaction rollback": serialization failure, deadlock.
    if sqlstate.startswith("40"):
        return TransientError(f"PostgreSQL aborted the transaction: {exc}")
    if own and isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
        # No table, or one from an older release: the migrations have not run.
        # The primary message alone: the full one quotes the statement over lines.
        return SchemaMissing(
            f"The key store's schema is missing or older than this release "
            f"({exc.diag.message_primary or exc}): "
            "run `idempotence migrate --database URL`"
        )
    # No SQLSTATE means libpq itself failed (refused, reset, timed out); class 08 is a
    # connection exception, 57P0x a server shutting down or starting, 53 out of
    # resources (too many connections).
    # 57014 is a statement cancelled, by statement_timeout, and 25P03 a transaction
    # ended by idle_in_transaction_session_timeout: the store could not do it within
    # its bound (DESIGN 13).
    if (
        isinstance(exc, psycopg_pool.PoolTimeout)
        or (isinstance(exc, psycopg.OperationalError) and not sqlstate)
        or sqlstate.startswith(("08", "57P", "53", "57014", "25P03"))
    ):
        return StoreUnavailable(f"PostgreSQL is unavailable: {exc}")
    return StoreError(f"PostgreSQL error: {exc}")


DRIVER_ERRORS = (psycopg.Error, psycopg_pool.PoolTimeout)


class _Held:
    """Inside `translated`: a claim's lock wait that ran out (F8) is KeyHeld."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            raise KeyHeld(str(exc)) from exc


_HELD = _Held()

translated = translator(DRIVER_ERRORS, translate)
"""``with translated(query.name):`` raises the library's error for a psycopg or pool error."""


def held() -> _Held:
    return _HELD


# libpq's states the request path compares with, as module constants (the same enum
# members): a member read off its enum class goes through the metaclass's attribute
# lookup, several times a request.
IDLE = pq.TransactionStatus.IDLE
INTRANS = pq.TransactionStatus.INTRANS
TUPLES_OK = pq.ExecStatus.TUPLES_OK


def has_rows(cur: Any) -> bool:
    result = cur.pgresult
    return result is not None and result.status == TUPLES_OK


# -- a transaction in two round trips ---------------------------------------------------
#
# On the store's own connections (autocommit, no transaction open) a transaction that
# opens with an operation (a request-as-transaction claim, F3) sends the BEGIN and the
# operation's first statement in one pipeline, and the statements deferred to its
# commit (the finish) with the COMMIT in another: two round trips where there were
# four, and a shorter transaction. The store sends BEGIN, COMMIT and ROLLBACK itself.
# (psycopg forgets every prepared statement of a connection that runs a ROLLBACK,
# however it is sent: after a rollback, a held claim's (F8), the store's statements are
# prepared again over their next runs.) Anywhere else (an application's connection, a
# transaction already open) psycopg's transaction() is used, one statement a trip.

# A deferred statement goes out with the COMMIT, before anyone can look at its rows. A
# fenced write that the fence refuses (F1) matches no row; wrapped so, it fails instead
# (a division by zero), the server skips the COMMIT queued behind it, and the
# transaction can only roll back. Its one row says the write went through.
FAIL_UNLESS_APPLIED = "WITH applied AS ({statement}) SELECT 1 / count(*) AS applied FROM applied"


# A request-as-transaction claim (F3) meets a key that another request's transaction
# holds (its uncommitted INSERT, or its lock on the row) when a duplicate races it. Its
# INSERT ... ON CONFLICT would then wait for that transaction, however long the
# handler runs, on a pooled connection: a burst of duplicates would empty the pool for
# every other key. So the claim waits for a lock at most CLAIM_LOCK_WAIT (lock_timeout
# covers both waits; NOWAIT does not exist for an INSERT's conflict), then rolls back
# and answers from a read (KeyHeld, _ops.claim_held): 409, or with `wait` a poll
# outside any transaction (F8). Long enough for a twin that is committing already.
# The statements around the claim keep the transaction's own setting (the
# application's writes must not inherit the bound), and the claim statement sets and
# restores it itself (bounded_claim): no statement added, no trip added. The INSERT's
# row source sets the bound (saving the setting first) before the INSERT looks for a
# conflict; each branch of the final SELECT restores it once the INSERT is done. A
# claim whose INSERT gave up rolls back, setting and all.
CLAIM_LOCK_WAIT = "50ms"
_INSERT_SOURCE = "WHERE NOT EXISTS (SELECT FROM settled)"
_BOUND = (
    f"(SELECT set_config('lock_timeout', '{CLAIM_LOCK_WAIT}', true) FROM (SELECT set_config("
    "'idempotence.lock_timeout', current_setting('lock_timeout'), true)) AS saved) IS NOT NULL"
)
# The bound may not have run (a settled key skips the INSERT's source): then the saved
# setting is missing, or empty (a placeholder left by an earlier transaction), and the
# setting is the transaction's own still.
_RESTORE = (
    "set_config('lock_timeout', coalesce(nullif(current_setting("
    "'idempotence.lock_timeout', true), ''), current_setting('lock_timeout')), true)"
    " AS lock_wait_restored"
)
_BRANCHES = (
    "SELECT true AS claimed, now() AS db_now,",
    "SELECT false AS claimed, now() AS db_now,",
)
_CLAIMS = ("claim", "claim_finished")  # of one shape: see claim_finished
_bounded: dict[tuple[str, bool], str] = {}


def bounded_claim(query: Query, planning: bool = False) -> str:
    """The text of ``query`` (the ``claim``) that bounds its own lock wait (F8) and,
    with ``planning``, opens its transaction's planning settings (CLAIM_PLANNING)."""
    sql = _bounded.get((query.sql, planning))
    if sql is None:
        sql = query.sql
        if query.name not in _CLAIMS or any(
            sql.count(part) != 1 for part in (_INSERT_SOURCE, *_BRANCHES)
        ):
            raise StoreError(f"cannot bound the lock wait of the statement {query.name!r}")
        sql = sql.replace(_INSERT_SOURCE, f"{_INSERT_SOURCE} AND {_BOUND}")
        extra = f"{_RESTORE}, {CLAIM_PLANNING}" if planning else _RESTORE
        for branch in _BRANCHES:
            sql = sql.replace(branch, f"{branch} {extra},")
        _bounded[query.sql, planning] = sql
    return sql


def pipelines(raw: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    # The status from the libpq connection: raw.info builds a ConnectionInfo each time.
    return raw.autocommit and raw.pgconn.transaction_status == IDLE and _PIPELINES


_PIPELINES = psycopg.Pipeline.is_supported()  # the libpq's version: fixed for the process


def deferred_sql(query: Query) -> str:
    sql = _deferred.get(query.sql)
    if sql is None:
        sql = _deferred[query.sql] = FAIL_UNLESS_APPLIED.format(
            statement=query.sql.strip().rstrip(";")
        )
    return sql


_deferred: dict[str, str] = {}  # per statement text: the store's own few


# -- the rows of the store's own statements ----------------------------------------------
#
# psycopg's dict_row reads and decodes every column name of every result (the claim
# returns some twenty), and its jsonb loader parses the key row's two JSON columns,
# nearly always "{}" and "[]". The store's own statements, on the cursor each of its
# connections keeps for them, build a row maker once per list of column names (read
# from libpq as bytes, not decoded into psycopg's column objects at every result),
# and take their jsonb as text, which Dialect.json_out parses (with no parser at all for
# those two). The application's statements keep psycopg's rows and types.


class StatementRows:
    """The row factory of the cursor of the store's own statements: dicts, as
    psycopg's ``dict_row`` makes them, the maker of each list of column names built
    once. ``sql`` is the text of the statement whose rows come next."""

    __slots__ = ("_last", "_makers", "sql")

    def __init__(self) -> None:
        self.sql = ""
        self._makers: dict[tuple[bytes | None, ...], RowMaker[Row]] = {}
        #: By statement text (its hash kept by the string), the column names of its
        #: last result and their maker: the names compared, not hashed name by name.
        self._last: dict[str, tuple[tuple[bytes | None, ...], RowMaker[Row]]] = {}

    def __call__(self, cursor: Any) -> RowMaker[Row]:
        result = cursor.pgresult
        # A statement without parameters may be a script of several (a migration):
        # psycopg's own rows for those.
        if result is None or result.status != TUPLES_OK or not self.sql:
            return dict_row(cursor)
        # Keyed by the result's own column names (libpq's, undecoded: cheap to read),
        # not by the statement's text: `k.*` follows the table, which a migration may
        # change under a running app, even to as many columns with other names.
        names = tuple(map(result.fname, range(result.nfields)))
        last = self._last.get(self.sql)
        if last is not None and last[0] == names:
            return last[1]
        maker = self._makers.get(names)
        if maker is None:
            if len(self._makers) >= _MAKERS:  # the store's statements are few; a bound
                self._makers.clear()
            maker = self._makers[names] = _row_maker([column.name for column in cursor.description])
        if len(self._last) >= _MAKERS:
            self._last.clear()
        self._last[self.sql] = (names, maker)
        return maker


_MAKERS = 256


def _row_maker(names: list[str]) -> RowMaker[Row]:
    count = len(names)

    def make(values: Sequence[Any]) -> Row:
        # zip(strict=True)'s check, by hand: zip called with a keyword takes the slow
        # call path (a dict of the keyword), twice per request.
        if len(values) != count:
            raise ValueError(f"a row of {len(values)} values for {count} columns")
        return dict(zip(names, values))  # noqa: B905 - checked just above

    return make


K = TypeVar("K", psycopg.Cursor[Any], psycopg.AsyncCursor[Any])


class Cursors(Generic[K]):
    """The cursors a store's connection keeps for its life (a cursor per statement
    was a measurable share of a request: its creation, its row maker, its close),
    each made again if it was closed: one for the store's own statements, one for
    BEGIN and COMMIT (apart from the statement whose rows go out in the same pipeline,
    the claim's, the finish's: a cursor keeps only its last statement's rows; their
    rows are never read, so tuples), one for the application's statements (psycopg's
    own rows and types: its jsonb parsed)."""

    __slots__ = ("_application", "_control", "_raw", "_rows", "_statements")

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._rows = StatementRows()
        self._statements: K | None = None
        self._control: K | None = None
        self._application: K | None = None

    def statements(self, sql: str) -> K:
        """The cursor of the store's own statements, ``sql`` the next one's text."""
        cur = self._statements
        if cur is None or cur.closed:
            cur = self._statements = self._raw.cursor(row_factory=self._rows)
            cur.adapters.register_loader("jsonb", TextLoader)
        self._rows.sql = sql
        return cur

    def control(self) -> K:
        cur = self._control
        if cur is None or cur.closed:
            cur = self._control = self._raw.cursor()
        return cur

    def application(self) -> K:
        cur = self._application
        if cur is None or cur.closed:
            cur = self._application = self._raw.cursor(row_factory=dict_row)
        return cur


def settle_deferred(deferred: list[Op[Any]], rows: list[list[Row]], refused: bool) -> None:
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


# The store's statements are prepared by psycopg after a few runs, and PostgreSQL then
# plans each once per connection (a generic plan) instead of at every run: planning
# the claim costs more server CPU than running it (measured here: 0.25 ms against
# 0.05 for a replay's claim). A generic plan is kept until an ANALYZE of the table
# replaces it (and autovacuum may be off), so it must be the one-row lookup whatever
# the table held when it was made. Two things could make it something else:
# - a sequential scan, the cheapest plan while the table has a page or two, then a
#   read of the whole table at every statement as it grows. No text rules it out; so
#   the pools the store opens plan without one (SESSION_PLANNING). PostgreSQL scans
#   sequentially all the same where no index applies.
# - an index scan on the scope alone: the table's two unique indexes both lead with
#   the scope, and while the planner thinks a scope holds one row or fewer, a lookup
#   by (scope, key) costs the same as a scan of the scope on the primary key, which
#   is the smaller index and so wins the tie. So the statements that look a key up by
#   id name its key too: every index they could use is then a lookup of both columns
#   of a unique index. Those that look it up by key cannot name the id they do not
#   know. The planner thinks so in two cases:
#   - no statistics (a table never analyzed, or analyzed empty) while the table is
#     small: it then reckons a scope 1/200 of the rows, and a never-analyzed table at
#     ten pages at least, about 170 rows. Every fresh database, for its first hundred
#     keys or so. A generic plan made then is kept as the table grows, and every
#     claim reads the whole scope (seen here: 2-3 ms of server CPU per request after
#     a few thousand keys).
#   - statistics that say a row or less per scope (a table analyzed while each tenant
#     held a key or none).
#   A custom plan ties too, but it is made from the table's size at each run, and the
#   rows it reckons per scope grow with the table. So the store's connections plan
#   generically only where the statistics say two rows or more per scope, a number
#   the planner scales up as the table grows; a connection opened before that plans
#   every statement at every run (SESSION_PLANNING) until the pool replaces it. (An
#   ANALYZE replans the others; if it says a row per scope again, they tie again.)
#   With both indexes the same size, the order of the indexes breaks the tie, in
#   favour of the (scope, key) index until a REINDEX of the primary key (a known limit).
#   And no statement on one key implies the predicate of a partial index (the
#   sweeper's locked_at IS NOT NULL): a scan of a small partial index ties too.
# tests/test_postgres_plans.py holds the generic plan of every statement to this.
# The application's statements in a transaction on these connections (F3, phases)
# must plan as the server is configured, sequential scans allowed: the store opens
# every transaction there with TRANSACTION_PLANNING, or, when a request's claim opens
# it, with CLAIM_PLANNING in the claim itself. Then no generic plan of the store's may
# be made inside one, where it could be a scan: the store's statements in the middle
# of a transaction are sent unprepared (planned at that run), and those deferred to
# the COMMIT (the finish, a phase's checkpoint) follow COMMIT_PLANNING, which turns
# sequential scans off again, and are planned once. A claim that opens a transaction
# is planned before its own settings apply, with the connection's.
# The server's own setting is kept in idempotence.enable_seqscan first, for
# CLAIM_PLANNING, which cannot say TO DEFAULT; last, a connection opened while the
# statistics do not make generic plans safe plans at every run (see above). (One
# query of three statements: psycopg sends a query without parameters as it is, in
# one trip.)
SESSION_PLANNING = """
SELECT set_config('idempotence.enable_seqscan', current_setting('enable_seqscan'), false);
SET enable_seqscan = off;
SELECT set_config('plan_cache_mode', 'force_custom_plan', false)
WHERE NOT coalesce((
    SELECT c.reltuples / CASE
        WHEN s.n_distinct > 0 THEN s.n_distinct
        WHEN s.n_distinct < 0 THEN -s.n_distinct * c.reltuples
    END >= 2
    FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    JOIN pg_stats AS s
        ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'scope'
        -- A table with inheritance children has a second row, of the whole tree.
        AND s.inherited = (c.relkind = 'p')
    WHERE c.oid = to_regclass('idempotency_keys') AND c.reltuples > 0
), false)
"""
TRANSACTION_PLANNING = ("SET LOCAL enable_seqscan TO DEFAULT",)
# Set by each branch of the claim's final SELECT (a claim that returns no row runs
# again: claim_in_one_statement), as it bounds its lock wait: no statement added.
CLAIM_PLANNING = (
    "set_config('enable_seqscan', current_setting('idempotence.enable_seqscan'), true)"
    " AS seqscan_restored"
)
COMMIT_PLANNING = "SELECT set_config('enable_seqscan', 'off', true) AS seqscan_off"


L = TypeVar("L", Listener, AsyncListener)


def listener(
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
