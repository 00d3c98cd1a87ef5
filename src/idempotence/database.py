"""Database URLs: ``postgresql://…`` and ``sqlite:///path``, and the stores they open.

The CLI and the workers take one URL (``--database`` or ``IDEMPOTENCE_DATABASE_URL``);
this module turns it into a store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from .errors import ConfigurationError
from .observability import Instrumentation
from .stores import AsyncStore, Store

ENV_VAR = "IDEMPOTENCE_DATABASE_URL"


@dataclass(frozen=True, slots=True)
class DatabaseUrl:
    """A parsed database URL: which backend, and what to hand its store."""

    backend: Literal["postgres", "sqlite"]
    #: A libpq conninfo URL, or a SQLite file path (or ``:memory:``).
    target: str

    @classmethod
    def parse(cls, url: str) -> DatabaseUrl:
        """Parse ``url``.

        >>> DatabaseUrl.parse("sqlite:///data/keys.sqlite3")
        DatabaseUrl(backend='sqlite', target='data/keys.sqlite3')
        >>> DatabaseUrl.parse("sqlite:////var/lib/keys.sqlite3").target
        '/var/lib/keys.sqlite3'
        >>> DatabaseUrl.parse("postgresql://app@db:5432/app").backend
        'postgres'
        """
        scheme, sep, rest = url.partition("://")
        if not sep:
            raise ConfigurationError(
                f"not a database URL: {url!r}; use postgresql://USER@HOST/DB or sqlite:///PATH"
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
        raise ConfigurationError(
            f"unsupported database {scheme!r} in {url!r}: use postgresql:// or sqlite:///"
        )

    @classmethod
    def from_env(cls, url: str | None = None) -> DatabaseUrl:
        """``url`` if given, else ``$IDEMPOTENCE_DATABASE_URL``."""
        url = url or os.environ.get(ENV_VAR)
        if not url:
            raise ConfigurationError(f"no database given: pass --database URL or set {ENV_VAR}")
        return cls.parse(url)


def _check_ports(rest: str) -> None:
    """Refuse a port that is not a number from 1 to 65535 in ``host:port[,host:port]``
    (libpq would only say so on connecting, after the pool's retries).

    >>> _check_ports("app@db:5432,replica:5433/app")
    >>> _check_ports("h:99999/db")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    idempotence.errors.ConfigurationError: invalid port '99999' in the database URL: ...
    """
    hosts = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    for host in hosts.split(","):
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


def open_store(url: str | DatabaseUrl, *, instrumentation: Instrumentation | None = None) -> Store:
    """The sync store for ``url``, reporting to ``instrumentation`` if given."""
    parsed = url if isinstance(url, DatabaseUrl) else DatabaseUrl.parse(url)
    if parsed.backend == "postgres":
        from .stores.postgres import PostgresStore

        return PostgresStore(parsed.target, instrumentation=instrumentation)
    from .stores.sqlite import SqliteStore

    return SqliteStore(parsed.target, instrumentation=instrumentation)


def open_async_store(
    url: str | DatabaseUrl, *, instrumentation: Instrumentation | None = None
) -> AsyncStore:
    """The async store for ``url``, reporting to ``instrumentation`` if given."""
    parsed = url if isinstance(url, DatabaseUrl) else DatabaseUrl.parse(url)
    if parsed.backend == "postgres":
        from .stores.postgres import AsyncPostgresStore

        return AsyncPostgresStore(parsed.target, instrumentation=instrumentation)
    from .stores.sqlite import AsyncSqliteStore

    return AsyncSqliteStore(parsed.target, instrumentation=instrumentation)
