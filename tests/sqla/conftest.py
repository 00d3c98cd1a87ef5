"""The SQLAlchemy store's suites run on both databases it supports, each test on a
database of its own: PostgreSQL (psycopg 3) and a SQLite file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.postgres import ProvidedServer, create_database, drop_database

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Database:
    """One empty database, as SQLAlchemy URLs."""

    backend: str  # "postgres" or "sqlite"
    sync_url: str
    async_url: str


# A PostgreSQL database per test costs a second or two: the fast tier runs SQLite.
@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.slow), "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        path = tmp_path / "app.sqlite3"
        yield Database("sqlite", f"sqlite:///{path}", f"sqlite+aiosqlite:///{path}")
        return
    server: ProvidedServer = request.getfixturevalue("pg_server")
    url = create_database(server.url, prefix="idempotence_sqla")
    psycopg_url = url.replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield Database("postgres", psycopg_url, psycopg_url)
    finally:
        drop_database(server.url, url)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def uvicorn_process(
    module: str, env: dict[str, str], cwd: Path, *, app_dirs: tuple[Path, ...] = ()
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Serve ``module:app`` with uvicorn in a process of its own (so that it can be
    killed); yields its base URL and the process. Stopped with SIGINT at the end,
    killed if it does not stop."""
    port = free_port()
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), *map(str, app_dirs)])
    full_env = {**os.environ, "PYTHONPATH": path, **env}
    command = [sys.executable, "-m", "uvicorn", f"{module}:app", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--log-level", "warning"],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise AssertionError(f"uvicorn exited:\n{process.communicate()[0]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"uvicorn did not listen on {port}"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                output = process.communicate(timeout=20)[0]
            except subprocess.TimeoutExpired:
                process.kill()
                output = process.communicate()[0]
            # A clean shutdown (the lifespan closes the store and the engine); a
            # failure of the test itself is the one to report.
            assert sys.exc_info()[0] is not None or "Traceback" not in output, output
