"""How the Redis stores open and close their redis-py clients: the URL's options
checked before any command, a cluster's and a Sentinel master's URLs, no retry of a
failed command (DESIGN 8).

No I/O here but the clients' own; the stores are `_store_async` (`_store` is generated
from it) and the cached store's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import redis.asyncio.retry
import redis.backoff
import redis.exceptions
import redis.retry

from ...errors import ConfigurationError
from .._redis_url import SentinelTarget, check_redis_url
from ._store_shared import AsyncRedisCluster, RedisCluster, translated


def cluster_url(url: str) -> str | None:
    """``redis+cluster://...`` (or ``rediss+cluster://``) as the URL redis-py's cluster
    client takes; None for a plain server's URL."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("redis+cluster", "rediss+cluster"):
        return scheme.lower().partition("+")[0] + "://" + rest
    return None


def open_sentinel(kind: Any, target: SentinelTarget, options: Mapping[str, Any]) -> Any:
    """A client of the master that ``target``'s sentinels name, found again after a
    failover (redis-py's SentinelConnectionPool asks them at each new connection)."""
    timeouts = {k: v for k, v in options.items() if k.startswith("socket_")}
    sentinel = kind(
        list(target.sentinels),
        sentinel_kwargs={**timeouts, "ssl": target.tls} if target.tls else timeouts,
        **timeouts,
    )
    extra = {"ssl": True} if target.tls else {}
    return sentinel.master_for(
        target.service,
        db=target.db,
        username=target.username,
        password=target.password,
        **extra,
        **options,
    )


def open_client(kind: Any, url: str, options: Mapping[str, Any]) -> Any:
    """``kind.from_url(url, **options)`` for a URL checked first (`_redis_url`).
    What redis-py would refuse only at the first command, an option it does not know
    or an option's bad value, is refused here; a cluster that the sync client cannot
    discover while it starts is unavailable (P11)."""
    cluster = kind is RedisCluster or kind is AsyncRedisCluster
    check_redis_url(url, cluster=cluster)
    try:
        with translated():
            client = kind.from_url(url, **options)
        if not cluster:
            # A connection object made only to check its arguments, the URL's options:
            # never connected, nothing to close.
            pool = client.connection_pool
            pool.connection_class(**pool.connection_kwargs)
    except TypeError as exc:
        # "Connection.__init__() got an unexpected keyword argument 'foo'": the words
        # of redis-py's internals; the option's name is what the reader wrote.
        unknown = re.search(r"unexpected keyword argument '([^']*)'", str(exc))
        if unknown is None:
            raise ConfigurationError(f"invalid option in the Redis URL: {exc}") from None
        raise ConfigurationError(
            f"unknown option {unknown.group(1)!r} in the Redis URL: remove it (the URL "
            "takes redis-py's connection settings, as ?socket_timeout=5 or ?protocol=3)"
        ) from None
    except (ValueError, redis.exceptions.RedisError) as exc:
        raise ConfigurationError(f"invalid option in the Redis URL: {exc}") from None
    return client


def client_kinds(*kinds: type) -> str:
    """``redis.asyncio.client.Redis or ...``: the client classes a store takes."""
    return " or ".join(f"{kind.__module__}.{kind.__qualname__}" for kind in kinds)


def check_timeout(timeout: float) -> float:
    """``timeout`` if it is a positive number of seconds (redis-py would take 0 as a
    failure of every command, and refuse a negative one only at the first)."""
    if not isinstance(timeout, int | float) or not timeout > 0:  # NaN too
        raise ConfigurationError(
            f"a Redis timeout is a positive number of seconds, not {timeout!r}"
        )
    return timeout


def client_options(timeout: float) -> dict[str, Any]:
    timeout = check_timeout(timeout)
    return {
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout,
        "decode_responses": False,
    }


# -- the few calls whose sync and async spellings differ (scripts/unasync.py) ---------


def no_retry_async() -> Any:
    """No retry of a command that failed: a script is not idempotent (a finish sent
    twice would report its own first write as a lost lock), so a failure is reported
    (503) and the client retries the request instead."""
    return redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0)


def no_retry() -> Any:
    """`no_retry_async` for the sync client."""
    return redis.retry.Retry(redis.backoff.NoBackoff(), 0)


def pubsub(client: Any) -> Any:
    """A pub/sub of ``client`` (sync and async spell it alike; redis-py leaves it
    untyped)."""
    return client.pubsub()


async def close_async(closable: Any) -> None:
    """Close an async client or pub/sub (``aclose``)."""
    await closable.aclose()


def close(closable: Any) -> None:
    """Close a sync client or pub/sub."""
    closable.close()
