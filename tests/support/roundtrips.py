"""A TCP proxy in front of PostgreSQL that counts round trips.

A round trip is a turn of the conversation: the client sends (in one write or several)
and then waits for the server's answer. The proxy counts the times the client starts
sending again after the server has answered, which is what a pipeline saves and a
profiler cannot see.
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
        self._server_spoke: dict[int, bool] = {}
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

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
                self._server_spoke[id(client)] = True
            threading.Thread(target=self._pump, args=(client, server, id(client), True)).start()
            threading.Thread(target=self._pump, args=(server, client, id(client), False)).start()

    def _pump(self, source: socket.socket, sink: socket.socket, pair: int, upstream: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                with self._lock:
                    if upstream and self._server_spoke[pair]:
                        self._count += 1
                    self._server_spoke[pair] = not upstream
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


@contextlib.contextmanager
def round_trips(url: str) -> Iterator[RoundTrips]:
    proxy = RoundTrips(url)
    try:
        yield proxy
    finally:
        proxy.close()
