"""Commands to one Redis server on connections of the store's own, past redis-py's
client and pool machinery: the lane that the Redis store and the cached store take for
their per-request commands (a script, a GET) on a client they opened themselves.

Why: redis-py's ``execute_command`` wraps each command in a retry loop, a locked pool
checkout and release, connection-count and duration metrics and an event dispatch, all
in Python. That cost as much client CPU per command as sending and parsing it. Here a
command is a list ``pop``, :func:`pack`, a write (``send_packed_async``: redis-py's send without the
task that its asyncio spelling starts per command), ``read_response`` and an
``append``: the connection's own methods, which time out, reconnect and translate
errors as the client's would (``socket_timeout``, ``ConnectionError``,
``ResponseError``...).

Only for a plain server (not a cluster, whose client routes by slot) and only for a
client the store opened (an application's client keeps its own pool, limits and
instrumentation). Written once, async; :mod:`._redis_lane` is generated from it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import redis.exceptions

from ._redis_base import AsyncRedis, send_packed_async


def pack(args: tuple[Any, ...]) -> bytes:
    r"""A command in the Redis protocol (RESP): its arguments as bulk strings. The
    store's arguments are bytes, text (UTF-8) and integers, nothing else: redis-py's
    own packer runs every argument through its encoder, which cost more than the
    command's reply to parse.

    >>> pack(("GET", b"k", 7))
    b'*3\r\n$3\r\nGET\r\n$1\r\nk\r\n$1\r\n7\r\n'
    """
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif not isinstance(arg, bytes):
            arg = b"%d" % operator.index(arg)  # an int; a float would be a bug: TypeError
        out += (b"$%d\r\n" % len(arg), arg, b"\r\n")
    return b"".join(out)


async def _revive(connection: Any) -> None:
    """Drop an idle connection the server has closed (a restart, a failover, its idle
    ``timeout``, ``CLIENT KILL``), as redis-py's pool does at each checkout: an idle
    connection is sent nothing, so anything to read means it is gone. Sending then
    connects afresh, and the request never sees the dead connection (P11). One
    non-blocking poll of the socket."""
    try:
        if not await connection.can_read():
            return
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        pass
    await connection.disconnect()


class AsyncLane:
    """Idle connections of ``client``'s kind (made by its pool's ``make_connection``,
    so with its host, database, timeouts and protocol), one per command in flight:
    a connection is taken for one command and its whole reply, then put back."""

    def __init__(self, client: AsyncRedis) -> None:
        # redis-py leaves make_connection untyped.
        self._make: Callable[[], Any] = client.connection_pool.make_connection
        self._idle: list[Any] = []
        self._closed = False

    async def execute(self, *args: Any) -> Any:
        """Send one command and return its reply; a Redis error reply raises
        ``ResponseError`` (``NoScriptError``...), a dead or slow server
        ``ConnectionError`` / ``TimeoutError``, as from the client."""
        try:
            connection = self._idle.pop()
        except IndexError:
            connection = self._make()
        else:
            await _revive(connection)
        reusable = True
        try:
            await send_packed_async(connection, pack(args))
            return await connection.read_response()
        except redis.exceptions.ResponseError:
            raise  # an error reply, read whole: the connection is fine
        except BaseException:
            # Anything else (a timeout, a cancellation) may leave a reply half read:
            # the connection is closed (redis-py does too) and not reused.
            reusable = False
            await connection.disconnect(nowait=True)
            raise
        finally:
            if reusable:
                if self._closed:
                    await connection.disconnect()
                else:
                    self._idle.append(connection)

    async def evalsha(self, script: Any, keys: list[Any], args: list[Any]) -> Any:
        """Run a registered script (redis-py's ``Script``: its ``sha`` and ``script``)
        by EVALSHA, loading it first on ``NOSCRIPT`` (a restarted server)."""
        try:
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            await self.execute("SCRIPT", "LOAD", script.script)
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)

    async def close(self) -> None:
        """Close the idle connections; one in use is closed when its command ends."""
        self._closed = True
        while self._idle:
            await self._idle.pop().disconnect()
