"""Real HTTP servers on 127.0.0.1 for the suites: uvicorn (ASGI) and waitress (WSGI),
each in a thread of this process on a free port, and a raw-socket client for the
requests no well-behaved client library will send."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # the kernel picks a free port: no race for it
    return sock


@contextmanager
def uvicorn_server(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread; yields its base URL."""
    import uvicorn

    sock = _bound_socket()
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextmanager
def waitress_server(app: Any, *, threads: int = 40) -> Iterator[str]:
    """Serve ``app`` with waitress in a thread; yields its base URL."""
    from waitress.server import create_server

    server = create_server(
        app, host="127.0.0.1", port=0, threads=threads, clear_untrusted_proxy_headers=True
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        # The loop runs while any connection is open: close them all, not just the
        # listening socket, or it keeps a keep-alive client's channel to the end.
        from waitress import wasyncore

        server.close()
        wasyncore.close_all(server._map)
        server.task_dispatcher.shutdown()
        thread.join(timeout=10)


def raw_request(
    base_url: str, request: bytes, *, timeout: float = 10
) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as raw bytes on a new connection; return status, headers, body.

    The request should say ``Connection: close``: the body is read to EOF.
    """
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = _unchunk(body)
    return status, headers, body


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


def wait_for_health(url: str, process: subprocess.Popen[Any], what: str) -> None:
    """Poll ``url``/health until a server started in ``process`` answers; fail loudly
    if the process dies first or 20 s pass."""
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(url + "/health", timeout=1)
            return
        except httpx.TransportError:
            assert process.poll() is None, f"{what} died at start"
            assert time.monotonic() < deadline, f"{what} did not start"
            time.sleep(0.05)
