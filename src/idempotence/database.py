"""Database URLs: ``postgresql://…``, ``sqlite:///path``, ``mariadb://…`` (or
``mysql://…``) and ``redis://host:port/db``
(``rediss://`` with TLS, ``redis+cluster://host:port`` for a Redis Cluster), and the
stores they open.

The CLI and the workers take one URL (``--database`` or ``IDEMPOTENCE_DATABASE_URL``);
this module turns it into a store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from .errors import ConfigurationError
from .observability import Instrumentation
from .stores import AsyncStore, Store
from .stores._redis_url import check_redis_url, sentinel_url

if TYPE_CHECKING:
    from .stores.redis import AsyncRedisStore, RedisStore

REDIS_SCHEMES = (
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)
"""The URL schemes of the Redis store."""

ENV_VAR = "IDEMPOTENCE_DATABASE_URL"

_S_co = TypeVar("_S_co", covariant=True)


@dataclass(frozen=True, slots=True)
class DatabaseUrl:
    """A parsed database URL: which backend, and what to hand its store."""

    backend: Literal["postgres", "sqlite", "redis", "mariadb"]
    target: str
    """A libpq conninfo URL, a SQLite file path (or ``:memory:``), or the Redis URL."""

    @property
    def sql(self) -> bool:
        """Whether the URL names a SQL database (the maintenance services need one)."""
        return self.backend != "redis"

    def check_driver(self) -> None:
        """Raise
        [`ConfigurationError`][idempotence.maintenance.completer_async.ConfigurationError]
        naming the extra to install when this URL's driver is missing (psycopg for
        PostgreSQL, redis-py for Redis), instead of an import error deep in the
        store."""
        try:
            if self.backend == "postgres":
                from .stores.postgres import _store_shared  # noqa: F401
            elif self.backend == "mariadb":
                from .stores.mariadb import _store_shared as _mariadb  # noqa: F401
            elif not self.sql:
                from .stores.redis import _store_shared as _redis  # noqa: F401
        except ImportError as exc:  # the modules' own message names the extra
            raise ConfigurationError(str(exc)) from exc

    @classmethod
    def parse(cls, url: str) -> DatabaseUrl:
        """Parse ``url``.

        ```python
        DatabaseUrl.parse("sqlite:///data/keys.sqlite3")
        # DatabaseUrl(backend='sqlite', target='data/keys.sqlite3')
        DatabaseUrl.parse("sqlite:////var/lib/keys.sqlite3").target
        # '/var/lib/keys.sqlite3'
        DatabaseUrl.parse("postgresql://app@db:5432/app").backend
        # 'postgres'
        DatabaseUrl.parse("redis://127.0.0.1:6379/0")
        # DatabaseUrl(backend='redis', target='redis://127.0.0.1:6379/0')
        ```
        """
        scheme, sep, rest = url.partition("://")
        if not sep:
            raise ConfigurationError(
                f"not a database URL: {url!r}; use postgresql://USER@HOST/DB, sqlite:///PATH, "
                "mariadb://USER@HOST/DB or redis://HOST:PORT/DB"
            )
        scheme = scheme.lower()
        if scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
            _check_ports(rest)
            return cls("postgres", "postgresql://" + rest)
        if scheme == "sqlite":
            if not rest.startswith("/") or rest == "/":
                raise ConfigurationError(
                    f"a SQLite URL names a file after three slashes: sqlite:///relative.db "
                    f"or sqlite:////absolute.db, not {url!r}"
                )
            return cls("sqlite", rest[1:])
        if scheme in ("mariadb", "mysql"):
            _check_ports(rest)
            return cls("mariadb", "mariadb://" + rest)
        if scheme.endswith("+sentinel"):
            sentinel_url(url)  # a ConfigurationError says what to write
            return cls("redis", scheme + "://" + rest)
        if scheme in REDIS_SCHEMES:
            _check_ports(rest)
            # The database too: redis-py would read one it cannot parse as 0.
            check_redis_url(
                scheme.removesuffix("+cluster") + "://" + rest, cluster=scheme.endswith("+cluster")
            )
            return cls("redis", scheme + "://" + rest)
        raise ConfigurationError(
            f"unsupported database {scheme!r} in {url!r}: use postgresql://, sqlite:///relative "
            "or sqlite:////absolute, mariadb:// (or mysql://), redis://, rediss://, "
            "redis+cluster:// or redis+sentinel://"
        )

    @classmethod
    def from_env(cls, url: str | None = None) -> DatabaseUrl:
        """``url`` if given, else ``$IDEMPOTENCE_DATABASE_URL``."""
        url = url or os.environ.get(ENV_VAR)
        if not url:
            raise ConfigurationError(f"no database given: pass --database URL or set {ENV_VAR}")
        return cls.parse(url)


def _check_ports(rest: str) -> None:
    """Refuse a port that is not a number from 1 to 65535 in ``host:port[,host:port]``,
    and an IPv6 address without its closing bracket (libpq would only say so on
    connecting, after the pool's retries, quoting the whole URL and its password).

    ```python
    _check_ports("app@db:5432,replica:5433/app")
    _check_ports("h:99999/db")
    # Traceback (most recent call last):
    # idempotence.errors.ConfigurationError: invalid port '99999' in the database URL: ...
    ```
    """
    hosts = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    for host in hosts.split(","):
        if host.startswith("[") and "]" not in host:
            raise ConfigurationError(
                "invalid IPv6 address in the database URL: close its bracket, as in "
                "postgresql://USER@[::1]:5432/DB"
            )
        # An IPv6 address is bracketed: [::1]:5432.
        port = host.rpartition("]")[2] if host.startswith("[") else host
        if ":" not in port:
            continue
        port = port.rpartition(":")[2]
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            # Not the URL itself: it may carry a password.
            raise ConfigurationError(
                f"invalid port {port!r} in the database URL: use a number from 1 to 65535"
            )


class _Opens(Protocol[_S_co]):
    """A store class, as the URL's backend opens it."""

    def __call__(self, target: str, *, instrumentation: Instrumentation | None = ...) -> _S_co: ...


def _stores(
    url: str | DatabaseUrl,
) -> tuple[_Opens[Store | RedisStore], _Opens[AsyncStore | AsyncRedisStore], str]:
    """The sync and the async store class of ``url``'s backend, and what to hand them."""
    parsed = _parsed(url)
    # Imported here: a backend's driver is an extra, needed only when its URL is opened;
    # without it, a ConfigurationError names the extra (not an import traceback).
    parsed.check_driver()
    if parsed.backend == "redis":
        from .stores.redis import AsyncRedisStore, RedisStore

        return RedisStore, AsyncRedisStore, parsed.target
    if parsed.backend == "postgres":
        from .stores.postgres import AsyncPostgresStore, PostgresStore

        return PostgresStore, AsyncPostgresStore, parsed.target
    if parsed.backend == "mariadb":
        from .stores.mariadb import AsyncMariaDBStore, MariaDBStore

        return MariaDBStore, AsyncMariaDBStore, parsed.target
    from .stores.sqlite import AsyncSqliteStore, SqliteStore

    return SqliteStore, AsyncSqliteStore, parsed.target


def open_store(
    url: str | DatabaseUrl, *, instrumentation: Instrumentation | None = None
) -> Store | RedisStore:
    """The sync store for ``url``, reporting to ``instrumentation`` if given: a SQL
    [`Store`][idempotence.testing.harness.Store], or for a ``redis://`` URL a
    [`RedisStore`][idempotence.stores.redis.RedisStore] (a
    [`KeyStore`][idempotence.stores.redis.KeyStore] only)."""
    store, _, target = _stores(url)
    return store(target, instrumentation=instrumentation)


def open_async_store(
    url: str | DatabaseUrl, *, instrumentation: Instrumentation | None = None
) -> AsyncStore | AsyncRedisStore:
    """The async store for ``url``, reporting to ``instrumentation`` if given (an
    [`AsyncRedisStore`][idempotence.stores.redis.AsyncRedisStore] for a ``redis://`` URL)."""
    _, store, target = _stores(url)
    return store(target, instrumentation=instrumentation)


def open_sql_store(
    url: str | DatabaseUrl, *, instrumentation: Instrumentation | None = None
) -> Store:
    """[`open_store`][idempotence.database.open_store] for what needs a SQL store
    (flows, request-as-transaction, the maintenance services): a Redis URL is refused
    with a clear error."""
    parsed = _sql(url)
    store = open_store(parsed, instrumentation=instrumentation)
    assert isinstance(store, Store)
    return store


def open_async_sql_store(
    url: str | DatabaseUrl, *, instrumentation: Instrumentation | None = None
) -> AsyncStore:
    """[`open_async_store`][idempotence.database.open_async_store] for what needs a SQL
    store; a Redis URL is refused."""
    parsed = _sql(url)
    store = open_async_store(parsed, instrumentation=instrumentation)
    assert isinstance(store, AsyncStore)
    return store


def _parsed(url: str | DatabaseUrl) -> DatabaseUrl:
    return url if isinstance(url, DatabaseUrl) else DatabaseUrl.parse(url)


def _sql(url: str | DatabaseUrl) -> DatabaseUrl:
    parsed = _parsed(url)
    if not parsed.sql:
        raise ConfigurationError(
            "this needs a SQL database (postgresql:// or sqlite:///): a Redis store "
            "shares no transaction with the application and has no tables for flows, "
            "staged jobs or the maintenance services"
        )
    return parsed
