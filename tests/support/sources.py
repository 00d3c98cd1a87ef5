"""Every SQL store on every kind of source it takes, behind the sync face of
:mod:`tests.support.stores`: for the rules that must hold whatever the store's
connections come from (nesting, close).

PostgreSQL: a conninfo (a pool the store owns), the application's pool, the
application's one connection. SQLite: a file, ``":memory:"``, the application's
connection. Each in both flavours.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg_pool

from idempotence import AsyncSqliteStore, SqliteStore
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from tests.support.stores import Blocking, EventLoopThread

SOURCES = [
    f"{backend}-{flavour}-{source}"
    for backend, sources in (
        ("postgres", ("url", "pool", "connection")),
        ("sqlite", ("file", "memory", "connection")),
    )
    for flavour in ("sync", "async")
    for source in sources
]

#: The sources whose store opens connections of its own, as many as it needs.
OWNED_POOLS = ("url", "file")


@dataclass
class OnSource:
    """A store on one kind of source, and what the application opened for it."""

    id: str
    store: Any  # the sync face
    #: Whether the application's own pool or connection still works (True: none).
    app_alive: Callable[[], bool] = lambda: True
    #: Closes what the application opened, after the store.
    app_close: list[Callable[[], None]] = field(default_factory=list)


def open_on(source_id: str, loop: EventLoopThread, pg_url: str, sqlite_path: str) -> OnSource:
    """Open the store ``source_id`` names (one of :data:`SOURCES`), migrated."""
    backend, flavour, source = source_id.split("-")
    opener = _postgres if backend == "postgres" else _sqlite
    made = opener(flavour, source, loop, pg_url if backend == "postgres" else sqlite_path)
    made.id = source_id
    if source == "memory":
        made.store.migrate()
    return made


def _face(store: Any, loop: EventLoopThread) -> Any:
    return store if isinstance(store, PostgresStore | SqliteStore) else Blocking(store, loop)


def _postgres(flavour: str, source: str, loop: EventLoopThread, url: str) -> OnSource:
    kwargs = {"autocommit": True}
    if flavour == "sync":
        if source == "url":
            return OnSource("", PostgresStore(url))
        if source == "pool":
            pool: Any = psycopg_pool.ConnectionPool(
                url, min_size=1, max_size=4, kwargs=kwargs, open=True
            )
            return OnSource("", PostgresStore(pool), lambda: not pool.closed, [pool.close])
        conn: Any = psycopg.connect(url, autocommit=True)
        return OnSource("", PostgresStore(conn), lambda: _pg_alive(conn), [conn.close])
    if source == "url":
        return OnSource("", Blocking(AsyncPostgresStore(url), loop))
    if source == "pool":
        apool: Any = psycopg_pool.AsyncConnectionPool(
            url, min_size=1, max_size=4, kwargs=kwargs, open=False
        )
        loop.run(apool.open())
        store = Blocking(AsyncPostgresStore(apool), loop)
        return OnSource("", store, lambda: not apool.closed, [lambda: loop.run(apool.close())])
    aconn: Any = loop.run(psycopg.AsyncConnection.connect(url, autocommit=True))
    store = Blocking(AsyncPostgresStore(aconn), loop)
    alive = lambda: not aconn.closed  # noqa: E731
    return OnSource("", store, alive, [lambda: loop.run(aconn.close())])


def _pg_alive(conn: psycopg.Connection[Any]) -> bool:
    return not conn.closed and conn.execute("SELECT 1").fetchone() == (1,)


def _sqlite(flavour: str, source: str, loop: EventLoopThread, path: str) -> OnSource:
    kind: Any = SqliteStore if flavour == "sync" else AsyncSqliteStore
    if source == "file":
        return OnSource("", _face(kind(path), loop))
    if source == "memory":
        return OnSource("", _face(kind(":memory:"), loop))
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    return OnSource("", _face(kind(conn), loop), lambda: _sqlite_alive(conn), [conn.close])


def _sqlite_alive(conn: sqlite3.Connection) -> bool:
    try:
        row = conn.execute("SELECT 1").fetchone()
    except sqlite3.ProgrammingError:  # closed
        return False
    return bool(row == (1,))
