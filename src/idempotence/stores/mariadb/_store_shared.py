"""The MariaDB store's parts shared by the sync and the async store: the dialect, the
URL, error translation, and the driver calls whose two spellings differ (PyMySQL for
sync, aiomysql for async: aiomysql is PyMySQL's protocol under asyncio, so the two
take the same parameters, return the same rows and raise the same errors).

Why these drivers (``benchmarks/mariadb_drivers.py``: a claim-shaped transaction of
four round trips on MariaDB 10.11, this repository's 2-core machine, three runs): the
C drivers spend the least client CPU per call (mysqlclient 180-350 us, the MariaDB
connector 255-570 us) against PyMySQL's 330-560 us and aiomysql's 420-860 us (asyncmy
250-530 us), while calls per second were set by the server's commit in every case.
No C driver has an async twin of the same API, and the store is written once, async,
with its sync twin generated (DESIGN F7): PyMySQL and aiomysql are that pair, and
need no compiler or client library to install.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

try:
    import aiomysql
    import pymysql
    import pymysql.cursors
    from pymysql.constants import CLIENT, ER, SERVER_STATUS
    from pymysql.converters import escape_bytes
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "the MariaDB store needs PyMySQL and aiomysql: pip install 'idempotence[mariadb]'"
    ) from exc

from ...errors import (
    ConfigurationError,
    SchemaMissing,
    StoreError,
    StoreUnavailable,
    TransientError,
)
from ...states import ClaimRequest, StoredResponse
from ..sql import APPLICATION, Dialect, Op, Query, claim_in_transaction, to_pyformat, translator
from ._steps import plan

# The driver's base error, for the store modules: they import no driver themselves, so
# that a missing extra always surfaces as the ImportError above, naming the extra, and
# never as a bare "No module named 'pymysql'" from whichever module loads first.
DriverError = pymysql.err.Error

SCHEMES = ("mariadb", "mysql")
"""The URL schemes of the MariaDB store (a MySQL server is untested: see the docs)."""

DEFAULT_CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a connection before the store reports itself unavailable (P11)."""

CLAIM_LOCK_WAIT = 1
"""Seconds a claim that opens a transaction (F3) waits for a row another open
transaction holds before it gives up and is answered from a read (F8). InnoDB
counts lock waits in whole seconds; one is long enough for a twin that is
committing already."""

MIGRATION_LOCK_WAIT = 60
"""Seconds a migrator waits for another one's migrations to end."""

_MICROSECOND = timedelta(microseconds=1)


class MariaDBDialect(Dialect):
    """The MariaDB dialect: the claim is one write transaction that retries
    (``claim_in_transaction``), and times are ``DATETIME(6)`` in UTC."""

    name = "mariadb"
    claim_is_one_statement = False
    reads_before_insert = True

    def timestamp(self, value: Any) -> datetime:
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC)

    def duration_in(self, value: timedelta | None) -> Any:
        return None if value is None else value // _MICROSECOND

    def duration_out(self, value: Any) -> timedelta:
        return timedelta(microseconds=int(value))

    def claim(self, request: ClaimRequest, finished: StoredResponse | None = None) -> Op[Any]:
        return claim_in_transaction(self, request, finished)

    def application(self, sql: str, params: Any) -> Query:
        # PyMySQL takes %(name)s, not the :name every store takes (cached per text).
        return Query(APPLICATION, to_pyformat(sql), params or {})

    def script_statements(self, script: str) -> list[str]:
        # One statement per call: the sync driver does not send several at once.
        # Comment lines go first: a comment may end with a semicolon too.
        code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))
        return [step.sql for step in plan(code)]


# -- the URL -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Where and how the store connects: what a ``mariadb://`` URL says."""

    host: str = "127.0.0.1"
    port: int = 3306
    user: str | None = None
    password: str = field(default="", repr=False)
    database: str = ""
    unix_socket: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT

    @classmethod
    def from_url(cls, url: str, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> Settings:
        """Read ``mariadb://USER:PASSWORD@HOST:PORT/DATABASE`` (or ``mysql://``).

        Raises:
            ConfigurationError: another scheme, no database, a bad port, or an option
                the store does not know (only ``unix_socket`` is taken).
        """
        parts = urlsplit(url)
        if parts.scheme.lower() not in SCHEMES:
            raise ConfigurationError(
                f"not a MariaDB URL (scheme {parts.scheme!r}): use "
                "mariadb://USER:PASSWORD@HOST:PORT/DATABASE"
            )
        database = unquote(parts.path.lstrip("/"))
        if not database or "/" in database:
            raise ConfigurationError(
                "a MariaDB URL names one database after the host: mariadb://USER@HOST:3306/DATABASE"
            )
        try:
            port = parts.port or 3306
        except ValueError:
            raise ConfigurationError(
                "invalid port in the MariaDB URL: use a number from 1 to 65535"
            ) from None
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        unix_socket = options.pop("unix_socket", None)
        if options:
            raise ConfigurationError(
                f"unknown option(s) in the MariaDB URL: {', '.join(sorted(options))}; "
                "the store takes only ?unix_socket=PATH"
            )
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=port,
            user=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else "",
            database=database,
            unix_socket=unix_socket,
            connect_timeout=connect_timeout,
        )

    def connect_kwargs(self) -> dict[str, Any]:
        """The keyword arguments PyMySQL and aiomysql both take (each adds its own
        ``DictCursor``)."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "unix_socket": self.unix_socket,
            "charset": "utf8mb4",
            # The store's own statements commit themselves unless it opens a
            # transaction; found rows, not changed rows: a fenced write that sets
            # what is already there still proves the lease (see queries.sql).
            "autocommit": True,
            "client_flag": CLIENT.FOUND_ROWS,
            "connect_timeout": max(int(self.connect_timeout), 1),
            # Strict: a value too long for its column is an error, never cut short
            # (a truncated scope would share its keys with another scope's).
            "init_command": (
                "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@sql_mode, ''), "
                "'STRICT_TRANS_TABLES')"
            ),
        }


# -- the driver calls of each flavour ----------------------------------------------------


async def connect_async(settings: Settings) -> Any:
    """A new aiomysql connection."""
    with translated():
        return await aiomysql.connect(
            **settings.connect_kwargs(), db=settings.database, cursorclass=aiomysql.DictCursor
        )


def connect(settings: Settings) -> Any:
    """A new PyMySQL connection."""
    with translated():
        return pymysql.connect(
            **settings.connect_kwargs(),
            database=settings.database,
            cursorclass=pymysql.cursors.DictCursor,
        )


def bind_async(raw: Any, sql: str, params: Any) -> tuple[str, Any]:
    """``sql`` with ``params`` in, as aiomysql's ``execute`` would put them: aiomysql
    0.3 escapes bytes with a PyMySQL helper that PyMySQL 1.2 removed, so the async
    store escapes its parameters itself, each by the connection (its character set,
    its backslash mode), bytes as PyMySQL does."""
    if not params:
        return sql, None
    return sql % {
        name: escape_bytes(value) if isinstance(value, bytes) else raw.escape(value)
        for name, value in params.items()
    }, None


def bind(raw: Any, sql: str, params: Any) -> tuple[str, Any]:
    """``sql`` and ``params`` for PyMySQL's ``execute``, which puts them in itself."""
    return sql, params


AsyncSlots = asyncio.Semaphore
"""What caps the connections a store opens: tasks (async) or threads (sync) take
turns for a slot."""
Slots = threading.BoundedSemaphore


async def acquire_slot_async(slots: asyncio.Semaphore, seconds: float) -> bool:
    """Take a slot, waiting at most ``seconds``; whether it was taken."""
    try:
        async with asyncio.timeout(seconds):
            await slots.acquire()
    except TimeoutError:
        return False
    return True


def acquire_slot(slots: threading.BoundedSemaphore, seconds: float) -> bool:
    """Take a slot, waiting at most ``seconds``; whether it was taken."""
    return slots.acquire(timeout=max(seconds, 0.0))


def in_transaction(raw: Any) -> bool:
    """Whether the server says a transaction is open on ``raw`` (either driver)."""
    status = raw.server_status
    return bool(status is not None and status & SERVER_STATUS.SERVER_STATUS_IN_TRANS)


def idle_socket(raw: Any) -> socket.socket | None:
    """The socket of ``raw`` (either driver), or None if it has none (closed)."""
    sock = getattr(raw, "_sock", None)  # PyMySQL
    if sock is None and getattr(raw, "_writer", None) is not None:  # aiomysql
        sock = raw._writer.get_extra_info("socket")
    return sock if isinstance(sock, socket.socket) else None


def closed_while_idle(sock: socket.socket) -> bool:
    """Whether the server closed an idle connection (a restart, its wait_timeout): the
    store sends an idle connection nothing, so anything to read (the close, or the
    reason for it) means it is gone. One system call, no round trip."""
    return bool(select.select([sock], [], [], 0)[0])


# -- errors ------------------------------------------------------------------------------

_AUTOINC_READ_FAILED = 1467
""""Failed to read auto-increment value from storage engine" (not in PyMySQL's ER)."""

_GONE = {ER.CON_COUNT_ERROR, ER.SERVER_SHUTDOWN, 1927, ER.TOO_MANY_USER_CONNECTIONS}
"""The server's codes for a connection it is ending, and the client's own (2000 and up)."""


def translate(exc: BaseException, *, own: bool = True) -> StoreError:
    """The library's error for a PyMySQL (or aiomysql) error, raised ``from`` it by the
    caller; ``own`` is False for the application's statement (a missing table is
    then not the key store's)."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
    if code in (ER.LOCK_DEADLOCK, _AUTOINC_READ_FAILED):
        # A deadlock; InnoDB reports one on its table-wide AUTO_INCREMENT lock (which an
        # INSERT ... SELECT takes) as 1467. The store rolls back and runs it again.
        return TransientError(f"MariaDB aborted the transaction: {exc}")
    if own and code in (ER.NO_SUCH_TABLE, ER.BAD_FIELD_ERROR):
        # No table, or one from an older release: the migrations have not run.
        return SchemaMissing(
            f"The key store's schema is missing or older than this release ({exc.args[-1]}): "
            "run `idempotence migrate --database URL`"
        )
    if (
        isinstance(exc, pymysql.err.InterfaceError)
        or code >= 2000
        or code in _GONE
        or (isinstance(exc, pymysql.err.OperationalError) and code == 0)
    ):
        return StoreUnavailable(f"MariaDB is unavailable: {exc}")
    return StoreError(f"MariaDB error: {exc}")


translated = translator(pymysql.err.Error, translate)
"""``with translated(query.name):`` raises the library's error for a driver error."""


def held(exc: BaseException) -> bool:
    """Whether ``exc``, from a claim that opens a transaction (F3), means another open
    transaction holds the key (F8: the claim is then answered from a read): its lock
    wait ran out, InnoDB chose this claim as a deadlock's victim, or a twin inserted
    the key first."""
    return bool(exc.args) and exc.args[0] in (ER.LOCK_WAIT_TIMEOUT, ER.LOCK_DEADLOCK, ER.DUP_ENTRY)


def bounded(sql: str) -> str:
    """``sql`` waiting for a row lock at most `CLAIM_LOCK_WAIT` (F8)."""
    return f"SET STATEMENT innodb_lock_wait_timeout = {CLAIM_LOCK_WAIT} FOR {sql}"


def racing(query: Query, exc: BaseException) -> bool:
    """Whether ``exc`` from ``query`` is an insert that lost a race (a claim's key, a
    delivered job's job_key): the other transaction committed it first, so running the
    operation again reads it."""
    return (
        query.name in ("claim_insert", "claim_insert_finished", "deliver_job")
        and isinstance(exc, pymysql.err.IntegrityError)
        and bool(exc.args)
        and exc.args[0] == ER.DUP_ENTRY
    )
