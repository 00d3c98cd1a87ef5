"""Commands to one Redis server on connections of the store's own, past redis-py's
client and pool machinery: the lane that the sync Redis store and the sync cached
store take for their per-request commands (a script, a GET) on a client they opened
themselves.

Why: redis-py's ``execute_command`` wraps each command in a retry loop, a locked pool
checkout and release, connection-count and duration metrics and an event dispatch, all
in Python. That cost as much client CPU per command as sending and parsing it. Here a
command is a list ``pop``, `pack`, redis-py's ``send_packed_command`` and
``read_response`` and an ``append``: the connection's own methods, which time out,
reconnect and translate errors as the client's would (``socket_timeout``,
``ConnectionError``, ``ResponseError``...).

Only for a plain server (not a cluster, whose client routes by slot) and only for a
client the store opened (an application's client keeps its own pool, limits and
instrumentation). The async lane (`_lane_async`) is not this module's
twin: it reads replies as an asyncio protocol, which a blocking socket has no use for.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import redis.exceptions

from ._store_shared import Redis, reraise


def pack(args: tuple[Any, ...]) -> bytes:
    r"""A command in the Redis protocol (RESP): its arguments as bulk strings. The
    store's arguments are bytes, text (UTF-8) and integers, nothing else: redis-py's
    own packer runs every argument through its encoder, which cost more than the
    command's reply to parse.

    ```python
    pack(("GET", b"k", 7))
    # b'*3\r\n$3\r\nGET\r\n$1\r\nk\r\n$1\r\n7\r\n'
    ```
    """
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif not isinstance(arg, bytes):
            arg = b"%d" % operator.index(arg)  # an int; a float would be a bug: TypeError
        out += (b"$%d\r\n" % len(arg), arg, b"\r\n")
    return b"".join(out)


def _revive(connection: Any) -> None:
    """Drop an idle connection the server has closed (a restart, a failover, its idle
    ``timeout``, ``CLIENT KILL``), as redis-py's pool does at each checkout: an idle
    connection is sent nothing, so anything to read means it is gone. Sending then
    connects afresh, and the request never sees the dead connection (P11). One
    non-blocking poll of the socket."""
    try:
        if not connection.can_read():
            return
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        pass
    connection.disconnect()


class Lane:
    """Idle connections of ``client``'s kind (made by its pool's ``make_connection``,
    so with its host, database, timeouts and protocol), one per command in flight:
    a connection is taken for one command and its whole reply, then put back."""

    def __init__(self, client: Redis) -> None:
        # redis-py leaves make_connection untyped.
        self._make: Callable[[], Any] = client.connection_pool.make_connection
        self._idle: list[Any] = []
        self._closed = False

    @classmethod
    def of(cls, client: Redis) -> Lane:
        """The lane for a client the store opened."""
        return cls(client)

    def execute(self, *args: Any) -> Any:
        """Send one command and return its reply; a Redis error reply raises
        ``ResponseError`` (``NoScriptError``...), a dead or slow server
        ``ConnectionError`` / ``TimeoutError``, as from the client."""
        try:
            connection = self._idle.pop()
        except IndexError:
            connection = self._make()
        else:
            _revive(connection)
        reusable = True
        try:
            # Not redis-py's health check: _revive did what it does, without a PING.
            connection.send_packed_command([pack(args)], check_health=False)
            return connection.read_response()
        except redis.exceptions.ResponseError:
            raise  # an error reply, read whole: the connection is fine
        except BaseException:
            # Anything else (a timeout, a cancellation) may leave a reply half read:
            # the connection is closed (redis-py does too) and not reused.
            reusable = False
            connection.disconnect(nowait=True)
            raise
        finally:
            if reusable:
                if self._closed:
                    connection.disconnect()
                else:
                    self._idle.append(connection)

    def evalsha(
        self, script: Any, keys: list[Any], args: list[Any], library_errors: bool = False
    ) -> Any:
        """Run a registered script (redis-py's ``Script``: its ``sha`` and ``script``)
        by EVALSHA, loading it first on ``NOSCRIPT`` (a restarted server). With
        ``library_errors``, a failure raises the library's error (`translate`), as the
        async lane's does; else redis-py's."""
        try:
            try:
                return self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                self.execute("SCRIPT", "LOAD", script.script)
                return self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except Exception as exc:
            if not library_errors:
                raise
            reraise(exc)

    def close(self) -> None:
        """Close the idle connections; one in use is closed when its command ends."""
        self._closed = True
        while self._idle:
            self._idle.pop().disconnect()
