"""The backends a database URL can name: one row per store, the table that registers a
store with the library.

`database` parses a URL by the schemes listed here and opens the row's store classes,
so ``open_store``, the CLI, the workers and the demo take every backend of the table;
the error messages, the CLI's ``--database`` help and the migration notes name the
backends from it too. A store's classes are named as ``"module:Class"`` and imported
only when a URL of theirs is opened: a driver is an extra, and a missing one is said
by the store package's own import error (which names the extra).

A new store in this repository adds its row to `BACKENDS`; a database server's URL
(``scheme://USER:PASSWORD@HOST:PORT/DB``) needs nothing more than the row.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError
from .stores._redis_url import check_redis_url, sentinel_url

__all__ = ["BACKENDS", "Backend", "by_name", "by_scheme", "check_ports"]


@dataclass(frozen=True, slots=True)
class Backend:
    """One backend: the URLs that name it and the stores that open them."""

    name: str
    """Its name in a parsed URL (``DatabaseUrl.backend``); for a SQL store, the folder
    of its SQL files too (``idempotence/sql/<name>/``)."""
    title: str
    """Its name for people: ``"MariaDB"``."""
    schemes: tuple[str, ...]
    """The URL schemes it takes, lower case, the usual one first."""
    example: str
    """The form of its URL that messages and help texts show."""
    stores: tuple[str, str]
    """Its sync and its async store class, each as ``"module:Class"``."""
    sql: bool = True
    """Whether its stores share transactions with the application (SQL)."""
    prefixes: tuple[str, ...] = ()
    """Scheme prefixes it takes as well (``postgresql+`` for SQLAlchemy's URL forms)."""
    target: Callable[[str, str], str] | None = None
    """What its stores take for the URL ``<scheme>://<rest>``, given ``(scheme, rest)``;
    raises `ConfigurationError` for a URL it cannot take. None: a server's URL,
    ``<schemes[0]>://<rest>``, its ports checked (`check_ports`)."""

    def takes(self, scheme: str) -> bool:
        """Whether ``scheme`` (lower case) names this backend."""
        return scheme in self.schemes or scheme.startswith(self.prefixes)

    def target_of(self, scheme: str, rest: str) -> str:
        """What the stores take for ``<scheme>://<rest>`` (see `target`)."""
        if self.target is not None:
            return self.target(scheme, rest)
        check_ports(rest)
        return f"{self.schemes[0]}://{rest}"

    def store_classes(self) -> tuple[Any, Any]:
        """The sync and the async store class, imported now (the driver with them)."""
        return _imported(self.stores[0]), _imported(self.stores[1])


def _imported(reference: str) -> Any:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def check_ports(rest: str) -> None:
    """Refuse a port that is not a number from 1 to 65535 in ``host:port[,host:port]``,
    and an IPv6 address without its closing bracket (libpq would only say so on
    connecting, after the pool's retries, quoting the whole URL and its password).

    ```python
    check_ports("app@db:5432,replica:5433/app")
    check_ports("h:99999/db")
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


def _sqlite_file(scheme: str, rest: str) -> str:
    if not rest.startswith("/") or rest == "/":
        raise ConfigurationError(
            f"a SQLite URL names a file after three slashes: sqlite:///relative.db "
            f"or sqlite:////absolute.db, not {scheme + '://' + rest!r}"
        )
    return rest[1:]


def _redis_url(scheme: str, rest: str) -> str:
    url = f"{scheme}://{rest}"
    if scheme.endswith("+sentinel"):
        sentinel_url(url)  # a ConfigurationError says what to write
        return url
    check_ports(rest)
    # The database too: redis-py would read one it cannot parse as 0.
    check_redis_url(
        scheme.removesuffix("+cluster") + "://" + rest, cluster=scheme.endswith("+cluster")
    )
    return url


BACKENDS: tuple[Backend, ...] = (
    Backend(
        name="postgres",
        title="PostgreSQL",
        schemes=("postgresql", "postgres"),
        prefixes=("postgresql+",),
        example="postgresql://USER@HOST/DB",
        stores=(
            "idempotence.stores.postgres:PostgresStore",
            "idempotence.stores.postgres:AsyncPostgresStore",
        ),
    ),
    Backend(
        name="sqlite",
        title="SQLite",
        schemes=("sqlite",),
        example="sqlite:///PATH",
        stores=(
            "idempotence.stores.sqlite:SqliteStore",
            "idempotence.stores.sqlite:AsyncSqliteStore",
        ),
        target=_sqlite_file,
    ),
    Backend(
        name="mariadb",
        title="MariaDB",
        schemes=("mariadb", "mysql"),
        example="mariadb://USER@HOST/DB",
        stores=(
            "idempotence.stores.mariadb:MariaDBStore",
            "idempotence.stores.mariadb:AsyncMariaDBStore",
        ),
    ),
    Backend(
        name="redis",
        title="Redis",
        schemes=(
            "redis",
            "rediss",
            "redis+cluster",
            "rediss+cluster",
            "redis+sentinel",
            "rediss+sentinel",
        ),
        example="redis://HOST:PORT/DB",
        stores=(
            "idempotence.stores.redis:RedisStore",
            "idempotence.stores.redis:AsyncRedisStore",
        ),
        sql=False,
        target=_redis_url,
    ),
)
"""Every backend a URL can name, in the order messages list them."""


def by_scheme(scheme: str) -> Backend | None:
    """The backend whose URLs start with ``scheme`` (any case), or None."""
    scheme = scheme.lower()
    return next((backend for backend in BACKENDS if backend.takes(scheme)), None)


def by_name(name: str) -> Backend:
    """The backend named ``name`` (``DatabaseUrl.backend``).

    Raises:
        ValueError: When no backend has that name.
    """
    for backend in BACKENDS:
        if backend.name == name:
            return backend
    raise ValueError(f"no backend is named {name!r}: one of {[b.name for b in BACKENDS]}")


def examples(*, sql: bool | None = None) -> str:
    """The URL forms of the backends (only the SQL ones, or only the others), as a list
    in words: ``"postgresql://USER@HOST/DB, sqlite:///PATH or ..."``."""
    forms = [b.example for b in BACKENDS if sql is None or b.sql is sql]
    return forms[0] if len(forms) == 1 else f"{', '.join(forms[:-1])} or {forms[-1]}"
