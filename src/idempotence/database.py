"""Database URLs: ``postgresql://…``, ``sqlite:///path``, ``mariadb://…`` (or
``mysql://…``) and ``redis://host:port/db``
(``rediss://`` with TLS, ``redis+cluster://host:port`` for a Redis Cluster), and the
stores they open.

The CLI and the workers take one URL (``--database`` or ``IDEMPOTENCE_DATABASE_URL``);
this module turns it into a store. The backends, their schemes and their store classes
are a table (`idempotence._backends`): this module names none of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from ._backends import BACKENDS, by_name, by_scheme, examples
from .errors import ConfigurationError
from .observability import Instrumentation
from .stores import AsyncStore, Store

if TYPE_CHECKING:
    from .stores.redis import AsyncRedisStore, RedisStore

REDIS_SCHEMES = by_name("redis").schemes
"""The URL schemes of the Redis store."""

ENV_VAR = "IDEMPOTENCE_DATABASE_URL"

_S_co = TypeVar("_S_co", covariant=True)


@dataclass(frozen=True, slots=True)
class DatabaseUrl:
    """A parsed database URL: which backend, and what to hand its store."""

    backend: str
    """The backend's name in the table of backends (``postgres``, ``sqlite``,
    ``mariadb``, ``redis``)."""
    target: str
    """A libpq conninfo URL, a SQLite file path (or ``:memory:``), or the server's URL
    (MariaDB, Redis)."""

    @property
    def sql(self) -> bool:
        """Whether the URL names a SQL database (the maintenance services need one)."""
        return by_name(self.backend).sql

    def check_driver(self) -> None:
        """Raise
        [`ConfigurationError`][idempotence.maintenance.completer_async.ConfigurationError]
        naming the extra to install when this URL's driver is missing (psycopg for
        PostgreSQL, redis-py for Redis), instead of an import error deep in the
        store."""
        try:
            by_name(self.backend).store_classes()
        except ImportError as exc:  # the store package's own message names the extra
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
            raise ConfigurationError(f"not a database URL: {url!r}; use {examples()}")
        backend = by_scheme(scheme)
        if backend is None:
            others = ", ".join(f"{s}://" for b in BACKENDS for s in b.schemes[1:])
            raise ConfigurationError(
                f"unsupported database {scheme.lower()!r} in {url!r}: use {examples()} "
                f"(or {others})"
            )
        return cls(backend.name, backend.target_of(scheme.lower(), rest))

    @classmethod
    def from_env(cls, url: str | None = None) -> DatabaseUrl:
        """``url`` if given, else ``$IDEMPOTENCE_DATABASE_URL``."""
        url = url or os.environ.get(ENV_VAR)
        if not url:
            raise ConfigurationError(f"no database given: pass --database URL or set {ENV_VAR}")
        return cls.parse(url)


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
    sync, async_ = by_name(parsed.backend).store_classes()
    return sync, async_, parsed.target


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
            f"this needs a SQL database ({examples(sql=True)}): a Redis store "
            "shares no transaction with the application and has no tables for flows, "
            "staged jobs or the maintenance services"
        )
    return parsed
