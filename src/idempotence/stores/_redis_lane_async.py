"""Commands to one Redis server on connections of the store's own, past redis-py's
client, pool and connection machinery: the lane that the async Redis store and the
async cached store take for their per-request commands (a script, a GET) on a client
they opened themselves.

Why: per command, redis-py's ``execute_command`` runs a retry loop, a locked pool
checkout and release, metrics and an event dispatch, and its connection's
``read_response`` an ``asyncio.timeout``, an error-message format, a parser wrapper and
a stream reader, all in Python: about 84,000 instructions a command more than sending
it and parsing its reply (callgrind, benchmarks/profile_request.py ``redis-floor``),
as much as a guarded request's two scripts cost the server. Here redis-py still makes
and opens each connection (its host, TLS, password, database and connect timeout, as
the client's), and the lane then reads its socket as an asyncio protocol
(:class:`_Connection`): a command is a write and a future, its reply parsed by
hiredis as it arrives and bounded by the client's ``socket_timeout`` (one timer).

A connection carries one command at a time and is used again only after its whole
reply was read: a timeout, a cancellation or a lost connection closes it, so a reply
that comes late is never read as the answer to a later command (F1). Nor is a RESP3
push (redis-py speaks RESP3 by default; a server pushes maintenance notices): it is
skipped, and its connection closed once its command has its reply. An error reply
raises redis-py's own exception (``NoScriptError``, ``ResponseError``...), and a
server that is gone or silent ``ConnectionError`` / ``TimeoutError``, as from the
client.

Only for a plain server (not a cluster, whose client routes by slot), only for a
client the store opened (an application's client keeps its own pool, limits and
instrumentation), and only where hiredis is installed (``AsyncLane.of``). The sync lane
(:mod:`._redis_lane`) is not generated from this module: a blocking socket needs no
protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis.exceptions
from redis._parsers.base import BaseParser

from ._redis_base import AsyncRedis

hiredis: Any
try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis ships wheels for CPython only
    hiredis = None

#: What the reader returns for a reply not yet whole (its default, False, is also
#: RESP3's boolean false).
_PARTIAL = object()
#: A RESP3 push (a maintenance notice, an invalidation): never a command's reply
#: (hiredis >= 3.2, as the redis extra requires; no type at all without hiredis).
_PUSH: Any = getattr(hiredis, "PushNotification", ())


class _Connection(asyncio.Protocol):
    """One socket of the lane, read as a protocol: one command in flight at most."""

    def __init__(self, transport: Any, timeout: float | None, writer: Any) -> None:
        self._transport = transport
        self._writer = writer
        self._timeout = timeout
        # Error replies come back as redis-py's exceptions (NOSCRIPT: NoScriptError).
        self._reader = hiredis.Reader(
            protocolError=redis.exceptions.InvalidResponse,
            replyError=BaseParser.parse_error,
            notEnoughData=_PARTIAL,
        )
        self._waiting: asyncio.Future[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        #: False once closed, broken or retired (a push came): never used again.
        self.usable = True

    async def command(self, packed: bytes) -> Any:
        """Send one packed command; its reply (an error reply as an exception
        instance, not raised)."""
        loop = asyncio.get_running_loop()
        waiting = self._waiting = loop.create_future()
        self._transport.write(packed)
        if self._timeout is not None:
            self._timer = loop.call_later(self._timeout, self._timed_out)
        return await waiting

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        # Every message the data completes, not only the first: one left in the
        # reader would be read as the next command's reply, and each later command
        # would read its predecessor's.
        while True:
            try:
                reply = reader.gets()
            except redis.exceptions.InvalidResponse as exc:
                self._fail(exc)
                return
            if reply is _PARTIAL:
                return  # the rest is still on its way
            if isinstance(reply, _PUSH):
                # Not an answer. The connection ends its command (its reply is still
                # to come) and is then closed, as one redis-py would act on (a
                # maintenance notice: this endpoint moves, or its timeouts change).
                self.usable = False
                if self._waiting is None:
                    self.close()
                continue
            waiting = self._waiting
            if waiting is None or waiting.done():
                # A reply nobody waits for (one that came after its command was given
                # up): never read as another command's answer.
                self._fail(None)
                return
            self._waiting = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            waiting.set_result(reply)

    def eof_received(self) -> None:
        self._fail(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(None)

    def _timed_out(self) -> None:
        self._timer = None
        self._fail(redis.exceptions.TimeoutError("Timeout reading from Redis"))

    def _fail(self, error: Exception | None) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None and not waiting.done():
            waiting.set_exception(
                error or redis.exceptions.ConnectionError("Connection closed by server.")
            )
        self.close()

    def close(self) -> None:
        self.usable = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport.close()


class AsyncLane:
    """Idle connections of ``client``'s kind (made and opened by its pool's
    ``make_connection``, so with its host, database, timeouts and protocol), one per
    command in flight: a connection is taken for one command and its whole reply,
    then put back."""

    def __init__(self, client: AsyncRedis) -> None:
        # redis-py leaves make_connection untyped.
        self._make: Callable[[], Any] = client.connection_pool.make_connection
        self._idle: list[_Connection] = []
        self._closed = False

    @classmethod
    def of(cls, client: AsyncRedis) -> AsyncLane | None:
        """The lane for a client the store opened, or None where hiredis is not
        installed (the store then sends its commands through the client)."""
        return None if hiredis is None else cls(client)

    async def execute(self, *args: Any) -> Any:
        """Send one command and return its reply; a Redis error reply raises
        ``ResponseError`` (``NoScriptError``...), a dead or slow server
        ``ConnectionError`` / ``TimeoutError``, as from the client."""
        idle = self._idle
        while idle:
            connection = idle.pop()
            if connection.usable:  # not closed by the server while it was idle
                break
        else:
            connection = await self._connect()
        try:
            # hiredis's packer (in C) takes the store's bytes, text and integers alike.
            reply = await connection.command(hiredis.pack_command(args))
        except BaseException:
            # A timeout, a cancellation, a lost connection: its reply may still come.
            connection.close()
            raise
        if self._closed or not connection.usable:
            connection.close()
        else:
            idle.append(connection)
        if isinstance(reply, redis.exceptions.RedisError):
            raise reply  # an error reply, read whole: the connection is fine
        return reply

    async def _connect(self) -> _Connection:
        opened = self._make()
        await opened.connect()  # redis-py's: connect timeout, TLS, AUTH, SELECT
        writer = opened._writer
        # The socket is the lane's from here. redis-py's connection lets it go
        # without closing it; its stream writer stays with the lane's connection,
        # whose socket it would close when collected.
        opened._reader = opened._writer = None
        connection = _Connection(writer.transport, opened.socket_timeout, writer)
        writer.transport.set_protocol(connection)
        return connection

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
            self._idle.pop().close()
