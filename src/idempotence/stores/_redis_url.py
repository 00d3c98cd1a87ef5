"""Redis URLs, checked before redis-py reads them (without the driver: the CLI checks
a URL before it opens anything).

redis-py reads a database it cannot parse (``/abc``, ``/1/2``) as database 0. A store
or a cache given such a URL would share database 0's records with whoever else uses
it, and an eviction's tombstone would miss the cache it was meant for: so the database
is checked here, and refused with what to write instead.
"""

from __future__ import annotations

import urllib.parse

from ..errors import ConfigurationError

__all__ = ["check_redis_url"]

#: The schemes redis-py reads; a cluster's URL is one of them once ``+cluster`` is
#: dropped (``cluster_url``).
SCHEMES = ("redis", "rediss", "unix")


def check_redis_url(url: str, *, cluster: bool = False) -> str:
    """``url`` if redis-py will read it as written; else
    :class:`~idempotence.errors.ConfigurationError` saying what to fix. The message
    never repeats the URL, which may carry a password.

    >>> check_redis_url("redis://127.0.0.1:6379/2")
    'redis://127.0.0.1:6379/2'
    >>> check_redis_url("redis://127.0.0.1:6379/two")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    idempotence.errors.ConfigurationError: invalid database 'two' in the Redis URL: ...
    """
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is no port
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    except ValueError as exc:
        raise ConfigurationError(f"invalid Redis URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"unsupported scheme {scheme!r} for Redis: use redis://HOST:PORT/DB, "
            "rediss://HOST:PORT/DB (TLS) or unix:///PATH?db=DB"
        )
    databases = list(query.get("db", []))
    if scheme != "unix" and parts.path not in ("", "/"):
        databases.insert(0, parts.path[1:])  # a socket's path is no database
    for database in databases:
        if not (database.isascii() and database.isdigit()):
            raise ConfigurationError(
                f"invalid database {database!r} in the Redis URL: a database is a number, "
                "as in redis://HOST:PORT/0"
            )
        if cluster and int(database) != 0:
            raise ConfigurationError(
                f"a Redis Cluster has database 0 only, not {int(database)}: leave the "
                "database out of a redis+cluster:// URL"
            )
    return url
