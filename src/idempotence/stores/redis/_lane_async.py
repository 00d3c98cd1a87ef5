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
and opens the connection (its host, TLS, password, database and connect timeout, as
the client's), and the lane then reads its socket as an asyncio protocol
(`_Connection`): a command is a write and a future, its reply parsed by
hiredis as it arrives.

Every command in flight shares the one connection (Redis answers a connection's
commands in the order it read them): a command to an idle connection is written at
once, and while commands are in flight, those of one turn of the event loop go out
together at its end, in one write; the replies that arrive together are read in one
go. Under load that is one system call for many commands, on each side: a connection
per command cost the app's process a write, a wake-up and a read each (about a quarter
of a guarded request's CPU on Redis, benchmarks/http_bench.py), and the server as
much.

Each reply answers the oldest command still waiting, so a reply is never read as
another command's (F1): a command given up (cancelled: the client went away) keeps its
place, and its reply is read and dropped. A command still unanswered the client's
``socket_timeout`` after its write fails the connection, every command on it with
``TimeoutError``, as a lost connection does with ``ConnectionError``, and the next
command opens another: one attempt, whose failure every command waiting for it gets.
No clock is read and no timer set per command: while commands are in flight, the
connection's watchdog ticks four times a timeout and counts the commands written and
answered, so a command that hangs fails between one and 1.25 timeouts after its
write, never sooner. A
RESP3 push (redis-py speaks RESP3 by default; a server pushes maintenance notices) is
never a reply: it is skipped, and its connection takes no new command and closes once
those in flight are answered. An error reply raises redis-py's own exception
(``NoScriptError``, ``ResponseError``...) for its command alone.

Only for a plain server (not a cluster, whose client routes by slot), only for a
client the store opened (an application's client keeps its own pool, limits and
instrumentation), and only where hiredis is installed (``AsyncLane.of``). The sync lane
(`_lane`) is not generated from this module: a blocking socket needs no
protocol.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import redis.exceptions
from redis._parsers.base import BaseParser

from ._resp import evalsha_packed
from ._store_shared import AsyncRedis, reraise

hiredis: Any
try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis ships wheels for CPython only
    hiredis = None

_PARTIAL = object()
"""What the reader returns for a reply not yet whole (its default, False, is also
RESP3's boolean false)."""
_PUSH: Any = getattr(hiredis, "PushNotification", ())
"""A RESP3 push (a maintenance notice, an invalidation): never a command's reply
(hiredis >= 3.2, as the redis extra requires; no type at all without hiredis)."""


_TICKS = 4
"""How often per timeout a busy connection's watchdog looks at it (`_Connection._tick`):
a command that hangs fails between one and 1 + 1/_TICKS timeouts after its write."""

_GRACE = 0.01
"""A command past its deadline gets this long more before it times out: a loop that
was held up (a blocking call in a callback) runs its timers before it reads the
replies that came meanwhile."""


class _Connection(asyncio.Protocol):
    """One socket of the lane, read as a protocol: every command in flight on it,
    answered in the order sent (Redis answers a connection's commands in order)."""

    def __init__(self, transport: Any, timeout: float | None, writer: Any) -> None:
        self._transport = transport
        self._writer = writer
        #: The watchdog's tick, a share of the timeout (None: no timeout, no watchdog).
        self._every = None if timeout is None else timeout / _TICKS
        self._loop = asyncio.get_running_loop()
        # Error replies come back as redis-py's exceptions (NOSCRIPT: NoScriptError).
        self._reader = hiredis.Reader(
            protocolError=redis.exceptions.InvalidResponse,
            replyError=BaseParser.parse_error,
            notEnoughData=_PARTIAL,
        )
        #: Every command's future, written or about to be, oldest first.
        self._waiting: deque[asyncio.Future[Any]] = deque()
        #: Commands written, and answered, since the connection opened: the replies
        #: come in order, so the difference is the commands in flight.
        self._sent = 0
        self._answered = 0
        #: ``_sent`` at each of the watchdog's last ticks, oldest first.
        self._marks: deque[int] = deque(maxlen=_TICKS)
        #: The watchdog's next tick, None while the connection is idle.
        self._timer: asyncio.TimerHandle | None = None
        #: Whether the watchdog found a command past its timeout and gave it its grace.
        self._late = False
        #: The commands of this turn of the loop, to go out together at its end.
        self._out: list[bytes] = []
        #: False once closed, broken or retired (a push came): given no new command.
        self.usable = True

    def command(self, packed: bytes) -> asyncio.Future[Any]:
        """Queue one packed command; a future of its reply (an error reply as an
        exception instance, not raised). It is written at once to an idle connection,
        else with the others of this turn of the loop, at its end."""
        waiting = self._loop.create_future()
        self._waiting.append(waiting)
        out = self._out
        if out or self._answered != self._sent:
            # Commands in flight: their replies come in a later turn, so the ones
            # sent meanwhile wait for the end of this turn and go out together.
            if not out:
                self._loop.call_soon(self._flush)
            out.append(packed)
        else:
            self._write(packed, 1)  # an idle connection: nothing to wait for
        return waiting

    def _flush(self) -> None:
        out = self._out
        if out:  # nothing when the connection failed meanwhile (close() empties it)
            self._write(out[0] if len(out) == 1 else b"".join(out), len(out))
            out.clear()

    def _write(self, data: bytes, commands: int) -> None:
        self._transport.write(data)
        self._sent += commands
        # A command's time runs from its write, not from its call; no clock is read
        # and no timer set per write: the watchdog's ticks count the commands.
        if self._timer is None and self._every is not None:
            self._timer = self._loop.call_later(self._every, self._tick)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiting = self._waiting
        # Every message the data completes, each to the oldest command waiting.
        while True:
            try:
                reply = reader.gets()
            except redis.exceptions.InvalidResponse as exc:
                self._fail(exc)
                return
            if reply is _PARTIAL:
                break  # the rest is still on its way
            if isinstance(reply, _PUSH):
                # Not an answer. The connection takes no new command and is closed
                # once those in flight are answered, as one redis-py would act on (a
                # maintenance notice: this endpoint moves, or its timeouts change).
                self.usable = False
                continue
            if self._answered == self._sent:
                self._fail(None)  # an answer to nothing sent: the stream is not ours
                return
            self._answered += 1
            answered = waiting.popleft()
            # A command given up (cancelled) still has its answer read, and dropped.
            if not answered.done():
                answered.set_result(reply)
        if not self.usable and not waiting:
            self.close()

    def eof_received(self) -> None:
        self._fail(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(None)

    def _tick(self) -> None:
        """The watchdog, every ``timeout / _TICKS`` while commands are in flight: it
        notes how many were written by now, and fails the connection when one written
        before its tick a whole timeout ago (``_TICKS`` ticks back) is still
        unanswered. Per connection, not per command: a write only counts."""
        self._timer = None
        marks = self._marks
        if len(marks) == _TICKS and self._answered < marks[0]:
            if self._late:
                self._fail(redis.exceptions.TimeoutError("Timeout reading from Redis"))
                return
            # Its reply may be in, not yet read: one more look, after the loop's reads.
            # No mark at this tick, so the marks stay a tick's time apart or more.
            self._late = True
            self._timer = self._loop.call_later(_GRACE, self._tick)
            return
        self._late = False
        if self._answered == self._sent and marks and marks[-1] == self._sent:
            marks.clear()  # idle for a whole tick: no tick until the next write
            return
        marks.append(self._sent)
        # A tick runs only on a connection with a timeout: _every is a number.
        self._timer = self._loop.call_later(self._every, self._tick)  # type: ignore[arg-type]

    def _fail(self, error: Exception | None) -> None:
        self.close()
        self._answered = self._sent  # nothing more is read from it
        waiting = self._waiting
        while waiting:
            answered = waiting.popleft()
            if not answered.done():
                answered.set_exception(
                    error or redis.exceptions.ConnectionError("Connection closed by server.")
                )

    def retire(self) -> None:
        """Take no new command; close once those in flight are answered."""
        self.usable = False
        if not self._waiting:
            self.close()

    def close(self) -> None:
        self.usable = False
        self._out.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport.close()


class AsyncLane:
    """One connection of ``client``'s kind (made and opened by its pool's
    ``make_connection``, so with its host, database, timeouts and protocol), carrying
    every command in flight: they are written together, a turn of the loop at a
    time, and the replies, read together as they arrive, answer them in order."""

    def __init__(self, client: AsyncRedis) -> None:
        # redis-py leaves make_connection untyped.
        self._make: Callable[[], Any] = client.connection_pool.make_connection
        self._connection: _Connection | None = None
        #: The one attempt to open a connection, while it runs.
        self._opening: asyncio.Future[_Connection] | None = None
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
        connection = self._connection
        if connection is None or not connection.usable:
            connection = await self._connect()
        # hiredis's packer (in C) takes the store's bytes, text and integers alike.
        reply = await connection.command(hiredis.pack_command(args))
        if isinstance(reply, redis.exceptions.RedisError):
            raise reply  # an error reply, read whole: the connection is fine
        return reply

    async def _connect(self) -> _Connection:
        """The connection, opened once for every command that needs it: one attempt,
        whose failure each of them gets at once (not an attempt each, one after the
        other, each waiting out the connect timeout)."""
        if self._closed:
            raise redis.exceptions.ConnectionError("the Redis key store is closed")
        opening = self._opening
        if opening is None:
            opening = self._opening = asyncio.ensure_future(self._open())
            opening.add_done_callback(self._opened)
        # One command given up (cancelled) leaves the attempt to the others.
        return await asyncio.shield(opening)

    def _opened(self, opening: asyncio.Future[_Connection]) -> None:
        self._opening = None
        if not opening.cancelled():
            opening.exception()  # each command waiting raises it; none may be left

    async def _open(self) -> _Connection:
        if self._connection is not None:
            self._connection.retire()
        opened = self._make()
        await opened.connect()  # redis-py's: connect timeout, TLS, AUTH, SELECT
        writer = opened._writer
        # The socket is the lane's from here. redis-py's connection lets it go
        # without closing it; its stream writer stays with the lane's connection,
        # whose socket it would close when collected.
        opened._reader = opened._writer = None
        connection = _Connection(writer.transport, opened.socket_timeout, writer)
        writer.transport.set_protocol(connection)
        if self._closed:  # closed while it connected: never used, never left open
            connection.close()
            raise redis.exceptions.ConnectionError("the Redis key store is closed")
        self._connection = connection
        return connection

    async def evalsha(
        self, script: Any, keys: list[Any], args: list[Any], library_errors: bool = False
    ) -> Any:
        """Run a registered script (redis-py's ``Script``: its ``sha`` and ``script``)
        by EVALSHA, loading it first on ``NOSCRIPT`` (a restarted server). With
        ``library_errors``, a failure raises the library's error (`translate`:
        unreachable is ``StoreUnavailable``), so that the key store need not wrap
        each script in a coroutine of its own; else redis-py's."""
        try:
            try:
                packed = evalsha_packed(script.sha, keys, args)
            except TypeError:  # an argument that is not bytes (a cache entry's number)
                packed = hiredis.pack_command(("EVALSHA", script.sha, len(keys), *keys, *args))
            # execute()'s body, in line: every request runs a script or two, and a
            # coroutine less each is a share of what the lane costs over a bare socket.
            connection = self._connection
            if connection is None or not connection.usable:
                connection = await self._connect()
            reply = await connection.command(packed)
            if isinstance(reply, redis.exceptions.RedisError):
                if not isinstance(reply, redis.exceptions.NoScriptError):
                    raise reply
                await self.execute("SCRIPT", "LOAD", script.script)
                return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
            return reply
        except Exception as exc:
            if not library_errors:
                raise
            reraise(exc)

    async def close(self) -> None:
        """Take no new command; the connection closes once those in flight are
        answered (one still opening, as it opens)."""
        self._closed = True
        if self._connection is not None:
            self._connection.retire()
