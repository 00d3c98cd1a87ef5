"""Acceptance: the installed ``idempotence`` command, run in a subprocess.

Exit status 0 on success, 1 when the store fails, 2 for a usage error, 5 when the store
is unavailable; every error says what to do about it.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import psycopg
import pytest

from tests.support.postgres import ProvidedServer, _with_dbname

#: The slow tier: the CLI in processes of its own.
pytestmark = pytest.mark.slow

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
        (["stats", "--database", "mariadb://root@127.0.0.1:3306/x"], "mariadb"),
        (["migrate", "--database", "mysql://root@127.0.0.1:3306/x"], "mariadb"),
    ],
)
def test_a_url_whose_extra_is_not_installed_names_it_in_one_line(
    tmp_path: Path, args: list[str], extra: str
) -> None:
    # The drivers made unimportable, as on an install without the extra.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "for name in ('psycopg', 'psycopg_pool', 'redis', 'pymysql', 'aiomysql'):\n"
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


# -- one line in plain words, with the contract's exit status (2: usage or configuration) --


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The one line the command printed on stderr (its "Error: " prefix dropped)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0].removeprefix("Error: ")


@pytest.mark.parametrize(
    ("url", "extra", "opener"),
    [
        ("postgresql://postgres@127.0.0.1:5432/x", "postgres", "open_store"),
        ("postgresql://postgres@127.0.0.1:5432/x", "postgres", "open_async_store"),
        ("redis://127.0.0.1:6379/0", "redis", "open_store"),
        ("redis://127.0.0.1:6379/0", "redis", "open_async_store"),
        ("mariadb://root@127.0.0.1:3306/x", "mariadb", "open_store"),
        ("mysql://root@127.0.0.1:3306/x", "mariadb", "open_async_store"),
    ],
)
def test_the_python_api_names_the_extra_of_a_missing_driver(
    url: str, extra: str, opener: str
) -> None:
    """``open_store`` without the driver's extra raises ConfigurationError naming the
    extra, not a ModuleNotFoundError from deep inside the store."""
    program = (
        "import sys\n"
        "for name in ('psycopg', 'psycopg_pool', 'redis', 'pymysql', 'aiomysql'):\n"
        "    sys.modules[name] = None\n"
        "import idempotence\n"
        "try:\n"
        f"    idempotence.{opener}({url!r})\n"
        "except idempotence.ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert f"pip install 'idempotence[{extra}]'" in result.stdout


def test_the_demo_without_its_dependencies_names_the_demo_extra(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nfor name in ('starlette', 'uvicorn'):\n    sys.modules[name] = None\n"
    )
    env = {name: value for name, value in os.environ.items() if name != ENV_VAR}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [str(CLI), "demo", "--rides", "1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'idempotence[demo]'" in one_line_error(result)


def test_a_redis_database_the_server_does_not_have_is_a_configuration_error() -> None:
    result = idempotence("stats", "--database", "redis://127.0.0.1:6379/99")
    assert result.returncode == 2, result.stderr
    message = one_line_error(result)
    assert "has no database" in message
    assert "DB index" not in message  # redis-py's words, not the reader's


def test_an_unknown_redis_url_option_is_named_without_redis_py_internals() -> None:
    result = idempotence("stats", "--database", "redis://127.0.0.1:6379/0?foo=1")
    assert result.returncode == 2, result.stderr
    message = one_line_error(result)
    assert "unknown option 'foo' in the Redis URL" in message
    assert "__init__" not in message and "keyword argument" not in message


def test_redis_cluster_url_of_a_plain_server_is_a_configuration_error() -> None:
    """Not 5 ("unavailable, retry later"): no retry makes a plain server a cluster."""
    result = idempotence("stats", "--database", "redis+cluster://127.0.0.1:6379")
    assert result.returncode == 2, result.stderr
    assert "not a cluster node" in one_line_error(result)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://postgres:s3cret@[::1:5432/x", "invalid IPv6 address"),
        ("postgresql://postgres:s3cret@127.0.0.1:5432/x?foo=1", 'parameter: "foo"'),
    ],
)
def test_a_malformed_postgres_url_is_a_usage_error_that_hides_the_password(
    url: str, expected: str
) -> None:
    result = idempotence("stats", "--database", url)
    assert result.returncode == 2, result.stderr
    message = one_line_error(result)
    assert expected in message
    assert "s3cret" not in result.stderr


def test_migrate_into_a_missing_directory_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    result = idempotence("migrate", "--database", f"sqlite:///{missing}/keys.db")
    assert result.returncode == 2, result.stderr
    assert f"the directory {missing} does not exist" in one_line_error(result)


def test_sqlite_migrate_says_why_a_number_is_skipped(tmp_path: Path) -> None:
    """SQLite's migrations are 0001, 0002, 0003 and 0005: the output says that 0004
    is PostgreSQL's alone, rather than leave a reader to wonder what went missing."""
    result = idempotence("migrate", "--database", f"sqlite:///{tmp_path}/k.db")
    assert result.returncode == 0, result.stderr
    assert "0003_maintenance, 0005_calling" in result.stdout
    assert "0004 skipped: 0004_waiters is for PostgreSQL only" in result.stdout


def test_keys_list_says_when_it_stops_at_its_limit(tmp_path: Path) -> None:
    from idempotence import ClaimRequest, SqliteStore

    url = f"sqlite:///{tmp_path}/k.db"
    with SqliteStore(str(tmp_path / "k.db")) as store:
        store.migrate()
        for n in range(3):
            store.claim(ClaimRequest(scope="s", key=f"k{n}", fingerprint="f"))

    cut = idempotence("keys", "list", "--database", url, "--limit", "2")
    assert cut.returncode == 0, cut.stderr
    assert "k2" in cut.stdout and "k1" in cut.stdout and "k0" not in cut.stdout
    assert "showing the newest 2 keys only: there are more" in cut.stderr
    assert "--limit" in cut.stderr

    whole = idempotence("keys", "list", "--database", url, "--limit", "3")
    assert whole.returncode == 0, whole.stderr
    assert "k0" in whole.stdout
    assert whole.stderr == ""

    as_json = idempotence("keys", "list", "--database", url, "--limit", "2", "--json")
    assert len(json.loads(as_json.stdout)) == 2  # stdout stays JSON


COMMANDS = [
    [],
    ["migrate"],
    ["sweep"],
    ["complete"],
    ["reap"],
    ["enqueue"],
    ["run-jobs"],
    ["worker"],
    ["keys"],
    ["keys", "list"],
    ["keys", "show"],
    ["keys", "evict"],
    ["stats"],
    ["reconcile"],
    ["demo"],
    ["demo", "serve"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "idempotence")
def test_help_speaks_plain_words(command: list[str]) -> None:
    """No requirement number of the design contract ("(B2)", "F7") in --help: those
    are for the contract's readers, not the operator's."""
    result = idempotence(*command, "--help")
    assert result.returncode == 0, result.stderr
    numbers = re.findall(r"\b[BFPRM]\d{1,2}\b", result.stdout)
    assert not numbers, result.stdout


@pytest.mark.parametrize(
    ("sink", "said"),
    [
        ("json:dumps", "is neither an amqp:// URL, a Celery app nor a sink"),
        ("json:nothing_here", "nothing_here"),
    ],
)
def test_a_sink_that_cannot_work_is_a_usage_error_saying_why(
    tmp_path: Path, sink: str, said: str
) -> None:
    result = idempotence("worker", "--database", f"sqlite:///{tmp_path}/w.db", "--sink", sink)
    assert result.returncode == 2, result.stderr
    assert said in result.stderr
    assert "Traceback" not in result.stderr


def test_the_worker_help_says_sinks_work_on_the_async_worker_too() -> None:
    said = " ".join(idempotence("worker", "--help").stdout.split())
    assert "async def on an async worker" in said
    assert "tried again with a growing pause" in said
