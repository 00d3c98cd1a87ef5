"""Acceptance: the installed ``idempotence`` command, run in a subprocess.

Exit status 0 on success, 1 when the store fails, 2 for a usage error, 5 when the store
is unavailable; every error says what to do about it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import psycopg
import pytest

from tests.support.postgres import ProvidedServer, _with_dbname

CLI = Path(sys.executable).parent / "idempotence"
ENV_VAR = "IDEMPOTENCE_DATABASE_URL"


def idempotence(
    *args: str, cwd: Path | None = None, database_env: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the command; ``$IDEMPOTENCE_DATABASE_URL`` is set only when given."""
    env = {name: value for name, value in os.environ.items() if name != ENV_VAR}
    if database_env is not None:
        env[ENV_VAR] = database_env
    return subprocess.run(
        [str(CLI), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def has_key_table(path: Path) -> bool:
    conn = sqlite3.connect(path)
    try:
        found = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'idempotency_keys'"
        ).fetchall()
    finally:
        conn.close()
    return found == [(1,)]


def test_version() -> None:
    result = idempotence("--version")
    assert result.returncode == 0, result.stderr
    assert metadata.version("idempotence") in result.stdout


def test_migrate_sqlite_then_up_to_date(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/k.db"  # an absolute path: four slashes

    first = idempotence("migrate", "--database", url)
    assert first.returncode == 0, first.stderr
    assert "applied" in first.stdout
    assert "0001_initial" in first.stdout

    again = idempotence("migrate", "--database", url)
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout
    assert has_key_table(tmp_path / "k.db")


def test_migrate_takes_the_database_from_the_environment(tmp_path: Path) -> None:
    """``$IDEMPOTENCE_DATABASE_URL`` stands in for ``--database``; three slashes name a
    path relative to the working directory."""
    first = idempotence("migrate", cwd=tmp_path, database_env="sqlite:///k.db")
    assert first.returncode == 0, first.stderr
    assert "0001_initial" in first.stdout

    again = idempotence("migrate", cwd=tmp_path, database_env="sqlite:///k.db")
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout
    assert has_key_table(tmp_path / "k.db")


def test_migrate_postgres(empty_pg_url: str) -> None:
    result = idempotence("migrate", "--database", empty_pg_url)
    assert result.returncode == 0, result.stderr
    assert "0001_initial" in result.stdout
    with psycopg.connect(empty_pg_url) as conn:
        exists = conn.execute("SELECT to_regclass('idempotency_keys') IS NOT NULL").fetchone()
    assert exists == (True,)


def test_migrate_without_a_database_says_how_to_give_one() -> None:
    result = idempotence("migrate")
    assert result.returncode == 2
    assert "--database" in result.stderr
    assert ENV_VAR in result.stderr


@pytest.mark.parametrize("source", ["option", "environment"])
@pytest.mark.parametrize(
    ("url", "accepted"),
    [
        pytest.param("oracle://x", ["postgresql://", "sqlite:///", "mariadb://"], id="unsupported"),
        pytest.param("sqlite://x.db", ["sqlite:///"], id="sqlite-two-slashes"),
    ],
)
def test_migrate_rejects_a_bad_url_with_the_accepted_forms(
    url: str, accepted: list[str], source: str
) -> None:
    if source == "option":
        result = idempotence("migrate", "--database", url)
    else:
        result = idempotence("migrate", database_env=url)
    assert result.returncode == 2
    assert url in result.stderr
    for form in accepted:
        assert form in result.stderr


def test_migrate_unreachable_postgres_fails_fast() -> None:
    """An unreachable store is an error of its own (exit 5, "unavailable", like P11's
    503), reported within the store's connect timeout, not libpq's minutes."""
    started = time.monotonic()
    result = idempotence("migrate", "--database", "postgresql://postgres@127.0.0.1:1/x")
    elapsed = time.monotonic() - started

    assert result.returncode == 5
    assert "unavailable" in result.stderr
    assert "Traceback" not in result.stderr
    assert elapsed < 15


@pytest.mark.parametrize("command", ["migrate", "stats", "worker"])
def test_a_refused_connection_fails_at_once_with_its_cause(command: str) -> None:
    """Within about a second (the pool retried for 5), on one line naming the cause,
    without the pool's warnings."""
    started = time.monotonic()
    result = idempotence(command, "--database", "postgresql://postgres@127.0.0.1:1/x")
    elapsed = time.monotonic() - started

    assert result.returncode == 5, result.stderr
    assert "Connection refused" in result.stderr
    assert "psycopg.pool" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert elapsed < 4


def test_an_unknown_database_fails_at_once_naming_it(pg_server: ProvidedServer) -> None:
    url = _with_dbname(pg_server.url, "idempotence_no_such_database")
    started = time.monotonic()
    result = idempotence("stats", "--database", url)

    assert result.returncode == 5, result.stderr
    assert 'database "idempotence_no_such_database" does not exist' in result.stderr
    assert "psycopg.pool" not in result.stderr
    assert time.monotonic() - started < 4


@pytest.mark.parametrize("port", ["99999", "abc", "0"])
def test_an_invalid_port_is_a_usage_error(port: str) -> None:
    result = idempotence("stats", "--database", f"postgresql://postgres@127.0.0.1:{port}/x")
    assert result.returncode == 2, result.stderr
    assert f"invalid port '{port}'" in result.stderr


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["migrate", "--database", "postgresql://postgres@127.0.0.1:5432/x"], "postgres"),
        (["keys", "list", "--database", "postgresql://postgres@127.0.0.1:5432/x"], "postgres"),
        (["keys", "list", "--database", "redis://127.0.0.1:6379/0"], "redis"),
        (["stats", "--database", "redis://127.0.0.1:6379/0"], "redis"),
        (["demo", "--database", "postgresql://postgres@127.0.0.1:5432/x"], "postgres"),
    ],
)
def test_a_url_whose_extra_is_not_installed_names_it_in_one_line(
    tmp_path: Path, args: list[str], extra: str
) -> None:
    # The drivers made unimportable, as on an install without the extra.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "for name in ('psycopg', 'psycopg_pool', 'redis'):\n"
        "    sys.modules[name] = None\n"
    )
    env = {name: value for name, value in os.environ.items() if name != ENV_VAR}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    result = subprocess.run([str(CLI), *args], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"pip install 'idempotence[{extra}]'" in result.stderr
    # One line (the demo's option error comes in click's usage form: its last line).
    assert result.stderr.strip().splitlines()[-1].startswith("Error: "), result.stderr
    assert args[0] == "demo" or len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_log_json_works_before_and_after_the_subcommand(tmp_path: Path, where: str) -> None:
    """#16: ``--log-json`` (and ``--log-level``) are the group's options, yet an
    operator writes them after the command too; every log line is then JSON."""
    url = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    assert idempotence("migrate", "--database", url).returncode == 0
    logging_options = ["--log-json", "--log-level", "info"]
    command = ["worker", "--database", url, "--interval", "0.1"]
    args = [*logging_options, *command] if where == "before" else [*command, *logging_options]
    env = {name: value for name, value in os.environ.items() if name != ENV_VAR}
    log = tmp_path / "worker.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen([str(CLI), *args], env=env, stderr=stderr, text=True)
    try:
        deadline = time.monotonic() + 20
        while "worker running" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.terminate()
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 0, text
    for line in text.strip().splitlines():
        assert isinstance(json.loads(line), dict), line
