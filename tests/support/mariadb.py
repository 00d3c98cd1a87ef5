"""A real MariaDB server for the tests, on any machine that has MariaDB installed.

The suite never mocks a store and never skips its MariaDB tests. `server_url`
finds or makes a server, once per test process:

1. ``IDEMPOTENCE_TEST_MARIADB`` holds a URL (``mariadb://root@host:port``): that server,
   which must answer. ``=throwaway`` forces step 3.
2. The machine's own server, ``mariadb://root@127.0.0.1:3306``, if it answers.
3. A throwaway server: ``mariadb-install-db`` into a temporary directory and
   ``mariadbd`` on a free port of 127.0.0.1, with durability switched off, stopped
   and deleted when the process exits. A few seconds.
4. Nothing worked: `MariaDBUnavailable` says what was tried and how to fix it.

Each test module that needs one gets a database of its own (`database`),
migrated, and dropped at the end. The fixtures are imported by the test modules that
use them (``from tests.support.mariadb import mariadb_url``).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pymysql
import pytest

ENV_VAR = "IDEMPOTENCE_TEST_MARIADB"
LOCAL = "mariadb://root@127.0.0.1:3306"


class MariaDBUnavailable(RuntimeError):
    """No MariaDB server could be found or started for the tests."""


def _connect(url: str, database: str | None = None) -> pymysql.Connection:  # type: ignore[type-arg]
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=database,
        autocommit=True,
        connect_timeout=2,
    )


def _answers(url: str) -> str | None:
    """None if the server at ``url`` answers, else why not."""
    try:
        _connect(url).close()
    except pymysql.err.Error as exc:
        return str(exc)
    return None


@functools.cache
def server_url() -> str:
    """The URL of a MariaDB server the tests may create databases on."""
    explicit = os.environ.get(ENV_VAR, "")
    if explicit and explicit != "throwaway":
        problem = _answers(explicit)
        if problem is not None:
            raise MariaDBUnavailable(f"{ENV_VAR}={explicit!r} does not answer: {problem}")
        return explicit
    tried = []
    if explicit != "throwaway":
        problem = _answers(LOCAL)
        if problem is None:
            return LOCAL
        tried.append(f"{LOCAL}: {problem}")
    try:
        return _throwaway()
    except (OSError, subprocess.SubprocessError, MariaDBUnavailable) as exc:
        tried.append(f"a throwaway server: {exc}")
    raise MariaDBUnavailable(
        "no MariaDB server for the tests. Tried:\n  "
        + "\n  ".join(tried)
        + f"\nInstall MariaDB (apt-get install mariadb-server), start it, or set {ENV_VAR}."
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _throwaway() -> str:
    install, daemon = shutil.which("mariadb-install-db"), shutil.which("mariadbd")
    daemon = daemon or ("/usr/sbin/mariadbd" if Path("/usr/sbin/mariadbd").exists() else None)
    if install is None or daemon is None:
        raise MariaDBUnavailable("mariadb-install-db or mariadbd is not installed")
    root = Path(tempfile.mkdtemp(prefix="idempotence-mariadb-"))
    data, sock, port = root / "data", root / "mariadb.sock", _free_port()
    user = ["--user=root"] if os.geteuid() == 0 else []
    subprocess.run(
        [
            install,
            "--no-defaults",
            f"--datadir={data}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            *user,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    process = subprocess.Popen(
        [
            daemon,
            "--no-defaults",
            f"--datadir={data}",
            f"--socket={sock}",
            f"--port={port}",
            "--bind-address=127.0.0.1",
            "--innodb-flush-log-at-trx-commit=0",
            "--skip-log-bin",
            f"--pid-file={root / 'mariadb.pid'}",
            *user,
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(root / "error.log", "w"),  # noqa: SIM115 - kept open for the server
    )

    def stop() -> None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(root, ignore_errors=True)

    atexit.register(stop)
    url = f"mariadb://root@127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while (problem := _answers(url)) is not None:
        if process.poll() is not None or time.monotonic() > deadline:
            log = (root / "error.log").read_text()[-2000:]
            raise MariaDBUnavailable(f"mariadbd did not start ({problem}):\n{log}")
        time.sleep(0.1)
    return url


def connect(url: str, **options: Any) -> pymysql.Connection:  # type: ignore[type-arg]
    """A PyMySQL connection to the database of ``url`` (a ``mariadb://`` URL naming one),
    opened as the store opens its own (autocommit, found rows, strict), rows as dicts;
    ``options`` change any of it."""
    from idempotence.stores.mariadb import Settings

    where = Settings.from_url(url)
    given = where.connect_kwargs() | {
        "database": where.database,
        "cursorclass": pymysql.cursors.DictCursor,
    }
    return pymysql.connect(**(given | options))


@contextmanager
def database(prefix: str = "idempotence", migrate: bool = True) -> Iterator[str]:
    """A database of its own on the test server (migrated), dropped afterwards: its
    ``mariadb://`` URL."""
    base = server_url()
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = _connect(base)
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    url = f"{base}/{name}"
    try:
        if migrate:
            from idempotence.stores.mariadb import MariaDBStore

            with MariaDBStore(url) as store:
                store.migrate()
        yield url
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


@pytest.fixture(scope="module")
def mariadb_url() -> Iterator[str]:
    """A migrated database of this test module's own (the run fails, never skips,
    without a MariaDB server)."""
    with database() as url:
        yield url
