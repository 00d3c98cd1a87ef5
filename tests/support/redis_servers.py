"""Redis for the cached store's tests: the shared server with a prefix of the test's
own (cleaned up by SCAN, never FLUSHALL), or a throwaway ``redis-server`` on a free
port that a test may stop and start (the shared one is never stopped).

A test that needs Redis and cannot have it fails: nothing is skipped.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

#: The shared server of the machine (tests/CI): override with IDEMPOTENCE_TEST_REDIS.
SHARED_URL = "redis://127.0.0.1:6379/0"


def shared_url() -> str:
    url = os.environ.get("IDEMPOTENCE_TEST_REDIS", SHARED_URL)
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise RuntimeError(f"the cached store's tests need Redis at {url}: {exc}") from exc
    finally:
        client.close()
    return url


def unique_prefix() -> str:
    return f"idempotence-test:{uuid.uuid4().hex}"


def drop_prefix(url: str, prefix: str) -> int:
    """Delete every key under ``prefix`` (SCAN, not KEYS); return how many."""
    client = redis.Redis.from_url(url)
    try:
        names = list(client.scan_iter(match=prefix + ":*", count=1000))
        if names:
            client.delete(*names)
        return len(names)
    finally:
        client.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class OwnRedis:
    """A ``redis-server`` of the test's own, without persistence, on a free port."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH: the test needs its own Redis")
        self._binary = binary
        self._workdir = workdir
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            [
                self._binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
                client.ping()
                client.close()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def freeze(self, frozen: bool = True) -> None:
        """SIGSTOP the server (it accepts connections and never answers), or resume it."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)

    def stop(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)
            self._process.kill()
            self._process.wait(timeout=10)
            self._process = None


@contextmanager
def own_redis(workdir: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
