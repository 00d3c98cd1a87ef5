"""Every code example in README.md and the documentation pages runs as written, one
after another, as a newcomer pasting them would.

The blocks and their markers are read by :mod:`tests.docs.blocks`. The examples run in
the order a reader meets them (the README, then the pages), each in a subprocess of its
own, all in ONE working directory and against ONE database: a SQLite file, then an
empty PostgreSQL database, given to every example as ``IDEMPOTENCE_DATABASE_URL`` (the
one variable the examples read, as the CLI does). On PostgreSQL, the stricter of the two
about schemas, the whole series runs twice, so an example that cannot run a second time
on the same database (a table another example made differently, a ``CREATE TABLE``
without ``IF NOT EXISTS``, a count that assumes an empty table) fails here; SQLite runs
it once (what a second round catches, an example that assumes an empty database, fails
on either backend alike, and the round cost a quarter of this module's minutes).
A block that is not run says why in its marker, and is listed in ``NOT_RUN`` below, so
none is left out silently: a new one fails here until it is listed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.docs.blocks import ROOT, Block, all_blocks

BLOCKS = all_blocks()
MODES = {"script", "pytest", "serve", "file", "console"}
RUN = [block for block in BLOCKS if block.mode in MODES]
URL_VARIABLE = "IDEMPOTENCE_DATABASE_URL"

#: The blocks that are deliberately not run: (document, the reason its marker gives,
#: up to its first semicolon).
NOT_RUN = {
    ("README.md", "an excerpt of examples/django_shop/shop/settings.py"),
    ("README.md", "creates virtual environments and installs from the network"),
    ("README.md", "installs from the network into your environment"),
    ("README.md", "the test suite itself"),
    ("docs/contributing/benchmarks.md", "measurements that take minutes"),
    ("docs/contributing/testing.md", "the test suite itself"),
    ("docs/explanation/stores.md", "needs a PostgreSQL server"),
    (
        "docs/how-to/cli.md",
        "needs the modules of your application (myapp), and `worker` runs until stopped",
    ),
    ("docs/how-to/consumers.md", "runs until SIGTERM"),
    (
        "docs/how-to/deploy-worker.md",
        "needs the modules of your application (myapp), and runs until stopped",
    ),
    ("docs/how-to/django-orm.md", "an excerpt of examples/django_shop/orders/models.py"),
    ("docs/how-to/django-orm.md", "an excerpt of examples/django_shop/orders/views.py"),
    ("docs/how-to/django.md", "an excerpt of examples/django_shop/shop/settings.py"),
    ("docs/how-to/fault-testing.md", "needs your app, its database and a fault to inject"),
    ("docs/how-to/redis.md", "needs a Redis master with replicas and Sentinel"),
    ("docs/how-to/sqlalchemy.md", "an Alembic revision file"),
    ("docs/tutorials/demo.md", "installs from the network"),
    ("docs/tutorials/getting-started.md", "installs from the network"),
    ("docs/tutorials/getting-started.md", "runs until Ctrl-C"),
    ("docs/contributing/testing.md", "installs the benchmarks' dependencies and wrk"),
    ("docs/contributing/testing.md", "the next example runs the same suite, with age_lock"),
    ("docs/how-to/celery.md", "needs a RabbitMQ broker and a Celery worker"),
    ("docs/how-to/staged-jobs.md", "needs a RabbitMQ broker or a Celery app"),
    ("docs/how-to/staged-jobs.md", "needs a RabbitMQ broker"),
}


def _env(database_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != URL_VARIABLE}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if database_url is not None:
        env[URL_VARIABLE] = database_url
    return env


def _check(result: subprocess.CompletedProcess[str], block: Block) -> None:
    assert result.returncode == 0, (
        f"the example at {block.id} failed (exit status {result.returncode}):\n"
        f"--- code ---\n{block.code}--- stdout ---\n{result.stdout}"
        f"--- stderr ---\n{result.stderr}"
    )


def _run(block: Block, command: list[str], cwd: Path, env: dict[str, str]) -> None:
    _check(
        subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=280),
        block,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def _server(
    command: list[str], port: int, cwd: Path, env: dict[str, str], what: str
) -> Iterator[list[str]]:
    """Run ``command`` until the block is done; yields a list that receives its output.

    Stopped with SIGINT (Ctrl-C, as a reader would), killed if it does not stop; a
    traceback in its output fails the example."""
    server = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"{what} exited:\n{server.communicate()[0]}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"{what} did not listen on {port}"
                time.sleep(0.2)
        yield output
    finally:
        server.send_signal(signal.SIGINT)
        try:
            output.append(server.communicate(timeout=30)[0])
        except subprocess.TimeoutExpired:
            server.kill()
            output.append(server.communicate()[0])
    assert "Traceback" not in output[-1], f"{what} logged an error:\n{output[-1]}"


def _serve(block: Block, cwd: Path, env: dict[str, str]) -> None:
    """Serve the block's ``app`` with uvicorn; send its request twice, one key."""
    words = block.arg.split()[1:]
    method, path = words[0], words[1]
    headers = dict(word.split("=", 1) for word in words[2:] if "=" in word and word[0] != "{")
    body = block.arg[block.arg.index("{") :] if "{" in block.arg else ""
    (cwd / "example_app.py").write_text(block.code)
    port = _free_port()
    command = [sys.executable, "-m", "uvicorn", "example_app:app", "--port", str(port)]
    with _server(command, port, cwd, env, f"{block.id}: uvicorn"):
        url = f"http://127.0.0.1:{port}{path}"
        headers |= {"idempotency-key": f"docs-{uuid.uuid4()}", "content-type": "application/json"}
        first = httpx.request(method, url, headers=headers, content=body, timeout=30)
        again = httpx.request(method, url, headers=headers, content=body, timeout=30)
    assert first.status_code < 400, (block.id, first.status_code, first.text)
    assert first.headers.get("idempotent-replayed") is None
    assert (again.status_code, again.content) == (first.status_code, first.content)
    assert again.headers.get("idempotent-replayed") == "true", again.headers


_AGAINST = re.compile(r"against `(?P<command>[^`]+)` on port (?P<port>\d+)")


def _console_against(block: Block, cwd: Path, env: dict[str, str]) -> None:
    """Run a console block against the server its marker names, started here on a free
    port (the block's port is replaced by the one chosen). Each HTTP status that the
    block's comments promise must appear in what the commands print."""
    match = _AGAINST.search(block.arg)
    assert match is not None, f"{block.id}: say `against `COMMAND` on port N`"
    port, provider_port = _free_port(), _free_port()
    command = [*shlex.split(match["command"]), "--port", str(port)]
    if "idempotence demo" in match["command"]:  # the demo's payment provider
        command += ["--provider-port", str(provider_port)]
    with _server(command, port, cwd, env, f"{block.id}: {match['command']}"):
        code = block.code.replace(f"127.0.0.1:{match['port']}", f"127.0.0.1:{port}")
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    _check(result, block)
    comments = " ".join(line for line in block.code.splitlines() if line.startswith("#"))
    for status in re.findall(r"\b[1-5]\d\d\b", comments):
        assert re.search(rf"(?<![\d.]){status}(?![\d.])", result.stdout), (
            f"{block.id} promises a {status}; the commands printed:\n{result.stdout}"
        )
    if "Idempotent-Replayed: true" in comments:
        assert "idempotent-replayed: true" in result.stdout.lower(), result.stdout


def _run_block(block: Block, cwd: Path, env: dict[str, str]) -> None:
    if block.mode == "script":
        (cwd / "example.py").write_text(block.code)
        _run(block, [sys.executable, "example.py"], cwd, env)
    elif block.mode == "pytest":
        (cwd / "test_example.py").write_text(block.code)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        _run(block, [*command, "test_example.py"], cwd, env)
    elif block.mode == "serve":
        _serve(block, cwd, env)
    elif block.mode == "file":
        (cwd / block.arg.split()[1]).write_text(block.code)
    elif "against `" in block.arg:
        _console_against(block, cwd, env)
    else:
        _run(block, ["bash", "-euo", "pipefail", "-c", block.code], cwd, env)


#: Rounds of the whole series per backend (see the module's docstring).
ROUNDS = {"sqlite": 1, "postgres": 2}


@pytest.mark.slow  # every example of the docs, each in a process of its own
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_every_example_runs_as_written_one_after_another_in_one_database(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "postgres":
        url = request.getfixturevalue("empty_pg_url")
    else:
        url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    env = _env(url)
    failed: list[str] = []
    for round_ in range(1, ROUNDS[backend] + 1):
        for block in RUN:
            try:
                _run_block(block, tmp_path, env)
            except AssertionError as exc:
                failed.append(f"round {round_}, {block.id}: {exc}")
    assert not failed, f"{len(failed)} examples failed on {backend}:\n\n" + "\n\n".join(failed)


def test_there_are_examples_and_each_one_is_run_or_says_why_not() -> None:
    assert len(RUN) >= 5, [block.id for block in RUN]
    unmarked = [block.id for block in BLOCKS if block.mode == "unmarked"]
    assert not unmarked, f"say whether these console blocks run (tests/docs/blocks.py): {unmarked}"
    unknown = [b.id for b in RUN if b.mode not in MODES]
    assert not unknown, unknown
    bare = [block.id for block in BLOCKS if not block.language]
    assert not bare, f"give these fenced blocks a language: {bare}"


def test_the_blocks_that_are_not_run_are_the_ones_listed_here() -> None:
    found = {
        (str(block.document.relative_to(ROOT)), block.arg.split(";")[0].strip())
        for block in BLOCKS
        if block.mode == "not-run"
    }
    reasonless = [block.id for block in BLOCKS if block.mode == "not-run" and len(block.arg) < 10]
    assert not reasonless, f"a not-run marker must say why: {reasonless}"
    assert found == NOT_RUN, json.dumps(sorted(found), indent=1)
