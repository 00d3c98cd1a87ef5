"""Redis URLs, checked before redis-py reads them (without the driver: the CLI checks
a URL before it opens anything).

redis-py reads a database it cannot parse as another one (``/abc`` as database 0,
``/1/2`` as 12). A store or a cache given such a URL would share that database's
records with whoever else uses it, and an eviction's tombstone would miss the cache it
was meant for: so the database is checked here, and refused with what to write instead.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from ..errors import ConfigurationError

__all__ = ["SentinelTarget", "check_redis_url", "sentinel_url"]

SCHEMES = ("redis", "rediss", "unix")
"""The schemes redis-py reads; a cluster's URL is one of them once ``+cluster`` is
dropped (``cluster_url``)."""


def check_redis_url(url: str, *, cluster: bool = False) -> str:
    """``url`` if redis-py will read it as written; else
    [`ConfigurationError`][idempotence.maintenance.completer_async.ConfigurationError]
    saying what to fix. The message never repeats the URL, which may carry a password.

    ```python
    check_redis_url("redis://127.0.0.1:6379/2")
    # 'redis://127.0.0.1:6379/2'
    check_redis_url("redis://127.0.0.1:6379/two")
    # Traceback (most recent call last):
    # idempotence.errors.ConfigurationError: invalid database 'two' in the Redis URL: ...
    ```
    """
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is no port
        query = urllib.parse.parse_qs(parts.query)
    except ValueError:
        # Not the parser's message: it may quote a password's text.
        raise ConfigurationError(
            "invalid Redis URL: write redis://[USER:PASSWORD@]HOST:PORT/DB, with '/', ':' "
            "and '@' in a password percent-encoded"
        ) from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"unsupported scheme {scheme!r} for Redis: use redis://HOST:PORT/DB, "
            "rediss://HOST:PORT/DB (TLS) or unix:///PATH?db=DB"
        )
    databases = list(query.get("db", []))
    path = urllib.parse.unquote(parts.path).strip("/")  # as redis-py reads it
    if scheme != "unix" and path:
        databases.insert(0, path)  # a socket's path is no database
    for database in databases:
        if not (database.isascii() and database.isdigit()):
            # Quoted only if it cannot be a password's text that broke the URL.
            shown = "" if "@" in database or ":" in database else f" {database!r}"
            raise ConfigurationError(
                f"invalid database{shown} in the Redis URL: a database is a number, as in "
                "redis://HOST:PORT/0 (percent-encode '/', ':' and '@' in a password)"
            )
        if cluster and int(database) != 0:
            raise ConfigurationError(
                f"a Redis Cluster has database 0 only, not {int(database)}: leave the "
                "database out of a redis+cluster:// URL"
            )
    return url


@dataclass(frozen=True)
class SentinelTarget:
    """A ``redis+sentinel://`` URL, read: where the sentinels are, which master."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    tls: bool
    username: str | None
    password: str | None


_SENTINEL_FORM = (
    "write redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB] "
    "(rediss+sentinel:// for TLS)"
)


def sentinel_url(url: str) -> SentinelTarget | None:
    """``redis+sentinel://`` (or ``rediss+sentinel://``) read; None for another URL.

    The password, if any, is the master's; the sentinels are asked without one.

    Raises:
        ConfigurationError: the URL names no sentinel, no service, or a database or
            port that is no number. The message never repeats the URL.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("redis+sentinel", "rediss+sentinel"):
        return None
    netloc, _, path = rest.partition("/")
    path = path.partition("?")[0]
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(secret) if colon else None
    sentinels = []
    for host in hosts.split(","):
        name, colon, port = host.rpartition(":") if ":" in host else (host, "", "26379")
        if not name or not (port.isascii() and port.isdigit()):
            raise ConfigurationError(f"invalid sentinel address in the Redis URL: {_SENTINEL_FORM}")
        sentinels.append((name.strip("[]"), int(port)))
    service, _, database = path.strip("/").partition("/")
    if not service:
        raise ConfigurationError(f"no service name in the Redis Sentinel URL: {_SENTINEL_FORM}")
    if database and not (database.isascii() and database.isdigit()):
        raise ConfigurationError(f"invalid database in the Redis Sentinel URL: {_SENTINEL_FORM}")
    return SentinelTarget(
        tuple(sentinels),
        urllib.parse.unquote(service),
        int(database or 0),
        scheme.lower().startswith("rediss"),
        username,
        password,
    )
