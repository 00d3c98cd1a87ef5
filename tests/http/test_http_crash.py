"""A server killed mid-request, restarted, and the request retried on the same key:
the work resumes and nothing happens twice (F3, R1, P5), through uvicorn (ASGI, async
store) and waitress (WSGI, sync store) on SQLite and PostgreSQL.

The server runs in a process of its own (tests/http/crash_server.py) and is SIGKILLed
while the request hangs at a point it chose; its effects are rows in the store's
database, so they are counted after the process is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.http import crash_server
from tests.http.clients import sync_store
from tests.http.servers import wait_for_health

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["uvicorn", "waitress"])
def server(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def crash_target(backend: str, target: str) -> str:
    with sync_store(backend, target) as store, store.transaction() as tx:
        tx.execute(crash_server.TABLE)
    return target


@contextlib.contextmanager
def serving(server: str, backend: str, target: str, directory: Path) -> Iterator[Server]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.http.crash_server", server, backend, target, str(directory)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield Server(process, f"http://127.0.0.1:{port}")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


class Server:
    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process = process
        self.url = url

    def post(self, path: str, key: str, timeout: float = 10) -> httpx.Response:
        return httpx.post(
            self.url + path, json={"amount": 20}, headers={"idempotency-key": key}, timeout=timeout
        )

    def wait_until_up(self) -> None:
        wait_for_health(self.url, self.process, "the crash server")


def effects(backend: str, target: str, key: str) -> list[str]:
    with sync_store(backend, target) as store, store.transaction() as tx:
        rows = tx.execute("SELECT what FROM crash_effects WHERE request_key = :key", {"key": key})
    return [row["what"] for row in rows]


def retry_until_done(server: Server, path: str, key: str) -> httpx.Response:
    """Retry like a client: 409 means the dead worker's lock still holds (P4, P5)."""
    deadline = time.monotonic() + 20
    while True:
        response = server.post(path, key)
        if response.status_code != 409 or time.monotonic() > deadline:
            return response
        assert response.json()["code"] == "idempotency_key_in_use"
        time.sleep(min(float(response.headers["retry-after"]), 0.25))


@pytest.mark.parametrize(
    ("path", "expected"),
    [("/tx/transfer", ["transfer"]), ("/rides", ["ride"])],
    ids=["request-as-transaction", "flow"],
)
def test_killed_mid_request_then_retried_resumes_without_duplicate(
    server: str, backend: str, crash_target: str, tmp_path: Path, path: str, expected: list[str]
) -> None:
    key = f"crash-{uuid.uuid4().hex}"
    (tmp_path / "hang").touch()
    with serving(server, backend, crash_target, tmp_path) as first:
        first.wait_until_up()
        failures: list[BaseException] = []

        def doomed() -> None:
            try:
                first.post(path, key, timeout=30)
            except httpx.TransportError as exc:  # the server died under it
                failures.append(exc)

        client = threading.Thread(target=doomed)
        client.start()
        deadline = time.monotonic() + 20
        while not (tmp_path / "reached").exists():
            assert time.monotonic() < deadline, "the request never reached its hang point"
            time.sleep(0.02)
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(timeout=10)
        client.join(timeout=10)
        assert failures, "the client got an answer from a server that was killed"

    # What the dead worker committed: the flow's first phase; the transaction, nothing.
    assert effects(backend, crash_target, key) == (["ride"] if path == "/rides" else [])

    (tmp_path / "hang").unlink()
    with serving(server, backend, crash_target, tmp_path) as second:
        second.wait_until_up()
        done = retry_until_done(second, path, key)
        replay = second.post(path, key)

    assert done.status_code == 201, done.text
    assert "idempotent-replayed" not in done.headers
    assert (replay.status_code, replay.content) == (201, done.content)
    assert replay.headers["idempotent-replayed"] == "true"
    assert effects(backend, crash_target, key) == expected  # exactly once


# -- F2: a plain handler's lock is extended while it runs ----------------------------------


def executions(directory: Path, key: str) -> list[str]:
    handled = directory / f"handled-{key}"
    return handled.read_text().split() if handled.exists() else []


def test_f2_a_live_handler_slower_than_its_lock_timeout_is_never_taken_over(
    server: str, backend: str, crash_target: str, tmp_path: Path
) -> None:
    key = f"slow-{uuid.uuid4().hex}"
    lock = crash_server.LOCK_TIMEOUT.total_seconds()
    (tmp_path / "slow").write_text(str(3 * lock))
    with serving(server, backend, crash_target, tmp_path) as live:
        live.wait_until_up()
        answers: list[httpx.Response] = []
        client = threading.Thread(target=lambda: answers.append(live.post("/handle/x", key)))
        client.start()
        deadline = time.monotonic() + 20
        while not executions(tmp_path, key):
            assert time.monotonic() < deadline, "the handler never started"
            time.sleep(0.02)
        started = time.monotonic()
        # Retries well past the lock timeout while the handler is still running: each
        # finds the lock kept alive by the heartbeat (P4), none takes the key over (P5).
        retries = []
        for at in (1.5 * lock, 2.5 * lock):
            time.sleep(max(0.0, started + at - time.monotonic()))
            retries.append(live.post("/handle/x", key))
        client.join(timeout=30)
        replay = live.post("/handle/x", key)

    assert [r.status_code for r in retries] == [409, 409], [r.text for r in retries]
    assert [r.json()["code"] for r in retries] == ["idempotency_key_in_use"] * 2
    assert int(retries[0].headers["retry-after"]) >= 1
    (first,) = answers
    assert first.status_code == 201, first.text
    assert executions(tmp_path, key) == [first.json()["execution"]]  # it ran once
    assert (replay.status_code, replay.content) == (201, first.content)
    assert replay.headers["idempotent-replayed"] == "true"


def test_f2_a_killed_handlers_key_is_taken_over_within_its_lock_timeout(
    server: str, backend: str, crash_target: str, tmp_path: Path
) -> None:
    key = f"dead-{uuid.uuid4().hex}"
    lock = crash_server.LOCK_TIMEOUT.total_seconds()
    (tmp_path / "hang").touch()
    with (
        serving(server, backend, crash_target, tmp_path) as doomed,
        serving(server, backend, crash_target, tmp_path) as survivor,
    ):
        doomed.wait_until_up()
        survivor.wait_until_up()
        failures: list[BaseException] = []

        def request() -> None:
            try:
                doomed.post("/handle/x", key, timeout=30)
            except httpx.TransportError as exc:  # the server died under it
                failures.append(exc)

        client = threading.Thread(target=request)
        client.start()
        deadline = time.monotonic() + 20
        while not (tmp_path / "reached").exists():
            assert time.monotonic() < deadline, "the request never reached its hang point"
            time.sleep(0.02)
        # Beaten past its lock timeout while it hangs: the dead-to-be worker is alive.
        time.sleep(2 * lock)
        assert survivor.post("/handle/x", key).status_code == 409
        (tmp_path / "hang").unlink()
        os.kill(doomed.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        doomed.process.wait(timeout=10)
        done = retry_until_done(survivor, "/handle/x", key)
        taken_over = time.monotonic() - killed
        client.join(timeout=10)
        assert failures, "the client got an answer from a server that was killed"

    assert done.status_code == 201, done.text
    # The last beat was at most lock / 3 before the kill: the lock lapses by then.
    assert taken_over < lock + 1.5, taken_over
    assert executions(tmp_path, key) == [executions(tmp_path, key)[0], done.json()["execution"]]


#: The plain handlers' crash tests, which the Redis and cached-store suites run too
#: (``crash_test(server, backend, target, tmp_path)``).
HANDLER_CRASH_TESTS = pytest.mark.parametrize(
    "crash_test",
    [
        test_f2_a_killed_handlers_key_is_taken_over_within_its_lock_timeout,
        test_f2_a_live_handler_slower_than_its_lock_timeout_is_never_taken_over,
    ],
    ids=["killed-is-taken-over", "live-is-never-taken-over"],
)
