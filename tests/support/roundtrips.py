"""A TCP proxy in front of PostgreSQL that counts round trips.

A round trip is a turn of the conversation: the client sends and then waits for the
server's answer. In the PostgreSQL protocol the client waits at a ``Sync`` (the end of
an extended-protocol exchange, or of a whole pipeline) and at a simple ``Query``: the
server answers each with ``ReadyForQuery``. So the proxy reads the client's messages
and counts those two: what a pipeline saves and a profiler cannot see. (Counting the
times the client wrote after the server spoke was timing-dependent: psycopg flushes a
pipeline's statements as it goes, and a busy machine let the server answer between
two writes of one pipeline.)

It counts the statements the client sends too: each ``Execute`` (extended protocol) and
each simple ``Query`` (which may carry several statements: one message, one count).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from psycopg import conninfo


class RoundTrips:
    """Listens on 127.0.0.1; :attr:`url` reaches the server of ``url`` through it."""

    def __init__(self, url: str) -> None:
        params = conninfo.conninfo_to_dict(url)
        self._upstream = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        self.url = conninfo.make_conninfo(url, host="127.0.0.1", port=port)
        self._lock = threading.Lock()
        self._count = 0
        self._statements = 0
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def count(self) -> int:
        """Round trips so far, on every connection."""
        with self._lock:
            return self._count

    @property
    def statements(self) -> int:
        """Statements sent so far (``Execute`` and ``Query`` messages), on every connection."""
        with self._lock:
            return self._statements

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._upstream)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, _Messages())).start()
            threading.Thread(target=self._pump, args=(server, client, None)).start()

    def _pump(self, source: socket.socket, sink: socket.socket, messages: _Messages | None) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if messages is not None:
                    turns, statements = messages.feed(data)
                    with self._lock:
                        self._count += turns
                        self._statements += statements
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class _Messages:
    """The client's side of one connection, split into protocol messages."""

    def __init__(self) -> None:
        self._buffer = b""
        # The first messages (SSLRequest, GSSENCRequest, StartupMessage) carry no type
        # byte; every later one does.
        self._untyped = True

    def feed(self, data: bytes) -> tuple[int, int]:
        """Take ``data``; return how many complete messages in it wait for the server
        (``Sync`` and simple ``Query``), and how many run a statement (``Execute`` and
        ``Query``)."""
        self._buffer += data
        turns = statements = 0
        while True:
            if self._untyped:
                if len(self._buffer) < 8:
                    return turns, statements
                length = int.from_bytes(self._buffer[:4], "big")
                code = int.from_bytes(self._buffer[4:8], "big")
                if len(self._buffer) < length:
                    return turns, statements
                self._buffer = self._buffer[length:]
                # SSL and GSS requests come before the StartupMessage (protocol 3.x).
                self._untyped = code in (80877103, 80877104)
                continue
            if len(self._buffer) < 5:
                return turns, statements
            length = int.from_bytes(self._buffer[1:5], "big")
            if len(self._buffer) < 1 + length:
                return turns, statements
            kind, self._buffer = self._buffer[:1], self._buffer[1 + length :]
            turns += kind in (b"S", b"Q")
            statements += kind in (b"E", b"Q")


@contextlib.contextmanager
def round_trips(url: str) -> Iterator[RoundTrips]:
    proxy = RoundTrips(url)
    try:
        yield proxy
    finally:
        proxy.close()
