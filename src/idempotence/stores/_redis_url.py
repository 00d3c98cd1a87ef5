"""Redis URLs, checked before redis-py reads them (without the driver: the CLI checks
a URL before it opens anything).

redis-py reads a database it cannot parse as another one (``/abc`` as database 0,
``/1/2`` as 12). A store or a cache given such a URL would share that database's
records with whoever else uses it, and an eviction's tombstone would miss the cache it
was meant for: so the database is checked here, and refused with what to write instead.
"""

from __future__ import annotations

import urllib.parse

from ..errors import ConfigurationError

__all__ = ["check_redis_url"]

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
