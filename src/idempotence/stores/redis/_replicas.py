"""Writes that wait for Redis replicas (``WAIT``) before the store reports them done
(DESIGN 13): the option's checks and what a short count means. No I/O here.

Redis replicates asynchronously: a master acknowledges a write before any replica has
it, and a replica promoted after the master died lacks the master's last writes. For
the key store that loss is a claim's lock (a retry then runs beside the first worker)
or a finish (a retry runs again, and the answer the client was given is gone). With
``replicas=N`` every script that writes is followed, on the same connection and in
the same round trip, by ``WAIT N timeout``, which returns once N replicas have
acknowledged every write made so far on that connection, or at the timeout with the
count that did. Fewer than N is not a success: the store raises
[`StoreUnavailable`][idempotence.errors.StoreUnavailable] (503), and the write, which
the master did make, is either confirmed by a later operation or lost with the master,
never reported.

A replay needs the same care: it may read a finish that the master has and no replica
yet (its finisher still waiting, or given up). ``WAIT`` is documented to cover its
own connection's writes, so a claim that finds a finished key makes one write of its own
(the record's finish time, written again unchanged) and waits for it, and with it for
everything the master wrote before: the replay is answered only once the finish it
replays would survive a failover.
"""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass

from ...errors import ConfigurationError, StoreUnavailable

URL_OPTIONS = ("replicas", "replica_timeout")
"""The query parameters of a Redis URL that are the store's, not redis-py's."""


@dataclass(frozen=True)
class ReplicaWait:
    """How many replicas a write waits for, and how long (``WAIT``'s arguments)."""

    replicas: int
    """0: no wait (Redis's own asynchronous replication)."""
    timeout_ms: int
    """At least 1: ``WAIT``'s 0 would wait without end."""

    @classmethod
    def of(cls, replicas: int, replica_timeout: float | None, timeout: float | None) -> ReplicaWait:
        """The checked option; ``timeout`` is the client's read timeout (None for an
        application's client, whose timeout the store does not know).

        ``replica_timeout`` None is half of ``timeout`` (0.5 s without one).

        Raises:
            ConfigurationError: a count that is no non-negative integer, a timeout
                that is no positive number, or one the client's read would cut short.
        """
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ConfigurationError(
                f"replicas is the number of Redis replicas a write waits for (0 for "
                f"none), not {replicas!r}"
            )
        if replica_timeout is None:
            replica_timeout = 0.5 if timeout is None else timeout / 2
        if (
            isinstance(replica_timeout, bool)
            or not isinstance(replica_timeout, int | float)
            or not replica_timeout > 0  # NaN too
            or math.isinf(replica_timeout)
        ):
            raise ConfigurationError(
                f"replica_timeout is a positive number of seconds, not {replica_timeout!r}"
            )
        if replicas and timeout is not None and replica_timeout >= timeout:
            raise ConfigurationError(
                f"replica_timeout ({replica_timeout:g} s) must be shorter than the store's "
                f"timeout ({timeout:g} s): the replicas' count must arrive before the "
                "read gives up on it"
            )
        return cls(replicas, max(1, math.ceil(replica_timeout * 1000)))

    def refused(self, operation: str, acked: int) -> StoreUnavailable:
        """The error for an ``operation`` that fewer than ``replicas`` replicas
        acknowledged in time."""
        return StoreUnavailable(
            f"the Redis key store's {operation} reached {acked} of the {self.replicas} "
            f"replica(s) it waits for within {self.timeout_ms / 1000:g} s: a failover could "
            "lose it, so it is not reported done (retry; a replica lagging or down is the "
            "cause)"
        )


def url_options(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without the store's own query parameters (`URL_OPTIONS`), and their
    values as written (redis-py would refuse them as unknown connection settings).

    ```python
    url_options("redis://h:6379/0?replicas=1&socket_keepalive=true")
    # ('redis://h:6379/0?socket_keepalive=true', {'replicas': '1'})
    ```
    """
    head, sep, query = url.partition("?")
    if not sep:
        return url, {}
    kept, ours = [], {}
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name in URL_OPTIONS:
            ours[name] = value
        else:
            kept.append((name, value))
    if not ours:
        return url, {}
    rest = urllib.parse.urlencode(kept)
    return (f"{head}?{rest}" if rest else head), ours


def from_url(
    ours: dict[str, str], replicas: int, replica_timeout: float | None
) -> tuple[int, float | None]:
    """The options given in a URL (`url_options`) merged with the store's arguments:
    one place for each, never both.

    Raises:
        ConfigurationError: a value that is no number, or an option given twice.
    """
    if "replicas" in ours:
        if replicas:
            raise ConfigurationError(
                "replicas is given both in the Redis URL and as an argument: give it once"
            )
        text = ours["replicas"]
        if not (text.isascii() and text.isdigit()):
            raise ConfigurationError(
                "replicas in the Redis URL is a number of replicas, as in ?replicas=1, "
                f"not {text!r}"
            )
        replicas = int(text)
    if "replica_timeout" in ours:
        if replica_timeout is not None:
            raise ConfigurationError(
                "replica_timeout is given both in the Redis URL and as an argument: give it once"
            )
        try:
            replica_timeout = float(ours["replica_timeout"])
        except ValueError:
            raise ConfigurationError(
                "replica_timeout in the Redis URL is a number of seconds, as in "
                f"?replica_timeout=0.5, not {ours['replica_timeout']!r}"
            ) from None
    return replicas, replica_timeout
