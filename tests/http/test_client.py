"""The retrying client (``idempotence.client``, DESIGN 10) against a real server that
misbehaves on order (tests/http/chaos_server.py: uvicorn in a process of its own):
connections dropped after the effect, 409/429/503 with Retry-After, a SIGKILL after the
effect and before the answer. Every operation must run exactly once and end with the
stored answer; the limits must hold; a stored 4xx is never retried. Times are the
server's (when each attempt arrived), with generous bounds.

Both clients run every test: the async source and the sync module generated from it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from idempotence.client import (
    AsyncIdempotentClient,
    Attempt,
    IdempotentClient,
    IdempotentResponse,
    KeyReused,
    RetriesExhausted,
    Retry,
)
from tests.http import crash_server
from tests.http.clients import sync_store
from tests.http.servers import wait_for_health

#: The slow tier: the retrying client against real servers and their faults.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FAST = Retry(
    max_attempts=20,
    deadline=timedelta(seconds=30),
    base_backoff=timedelta(milliseconds=20),
    max_backoff=timedelta(milliseconds=200),
)

#: Long enough to outlast a server restart (a second or two).
PATIENT = Retry(
    max_attempts=40,
    deadline=timedelta(seconds=30),
    base_backoff=timedelta(milliseconds=50),
    max_backoff=timedelta(seconds=1),
)


class ChaosServer:
    def __init__(self, backend: str, target: str, directory: Path) -> None:
        self.backend, self.target, self.directory = backend, target, directory
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [self.backend, self.target, str(self.directory), str(self.port)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.http.chaos_server", *args], cwd=ROOT
        )
        wait_for_health(self.url, self.process, "the chaos server")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(timeout=10)

    def plan(self, *actions: str) -> None:
        (self.directory / "plan.json").write_text(json.dumps(list(actions)))

    def attempts(self, key: str) -> list[dict[str, Any]]:
        log = self.directory / "attempts.jsonl"
        lines = log.read_text().splitlines() if log.exists() else []
        return [entry for entry in map(json.loads, lines) if entry["key"] == key]

    def effects(self, key: str) -> int:
        return len(crash_server_effects(self.backend, self.target, key))


def crash_server_effects(backend: str, target: str, key: str) -> list[str]:
    marker = "%(key)s" if backend == "postgres" else ":key"
    with sync_store(backend, target) as store, store.transaction() as tx:
        rows = tx.execute(
            f"SELECT what FROM crash_effects WHERE request_key = {marker}", {"key": key}
        )
    return [row["what"] for row in rows]


@pytest.fixture
def chaos(backend: str, target: str, tmp_path: Path) -> Iterator[ChaosServer]:
    with sync_store(backend, target) as store, store.transaction() as tx:
        tx.execute(crash_server.TABLE)
    server = ChaosServer(backend, target, tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def call(
    kind: str, url: str, key: str, body: dict[str, Any], retry: Retry = FAST
) -> tuple[IdempotentResponse, list[Attempt]]:
    """One operation with the ``kind`` client; its answer and every attempt it saw.
    An exception carries the attempts as ``attempts_seen``."""
    seen: list[Attempt] = []
    options: dict[str, Any] = {"key": key, "json": body, "observe": seen.append}
    try:
        if kind == "sync":
            with httpx.Client(timeout=10) as http:
                return IdempotentClient(http, retry=retry).post(url, **options), seen

        async def run() -> IdempotentResponse:
            async with httpx.AsyncClient(timeout=10) as http:
                return await AsyncIdempotentClient(http, retry=retry).post(url, **options)

        return asyncio.run(run()), seen
    except Exception as exc:
        exc.attempts_seen = seen  # type: ignore[attr-defined]
        raise


def stored_body(answer: IdempotentResponse) -> dict[str, Any]:
    body: dict[str, Any] = answer.response.json()
    return body


def gaps(server: ChaosServer, key: str) -> list[float]:
    times = [entry["at"] for entry in server.attempts(key)]
    return [later - earlier for earlier, later in itertools.pairwise(times)]


@pytest.fixture
def backend() -> str:
    """SQLite unless a test names its backends: the client's behaviour does not depend
    on the server's store (the kill test runs on both)."""
    return "sqlite"


def test_dropped_after_the_effect_the_retry_gets_the_stored_answer(
    chaos: ChaosServer, kind: str
) -> None:
    key = f"drop-{uuid.uuid4()}"
    chaos.plan("drop", "drop")
    answer, seen = call(kind, chaos.url + "/charges", key, {"amount": 20})
    assert (answer.status_code, answer.replayed, answer.attempts) == (201, True, 3)
    assert [a.error is not None for a in seen] == [True, True, False]
    assert all(isinstance(a.error, httpx.RemoteProtocolError) for a in seen[:2])
    assert chaos.effects(key) == 1
    # One key on every attempt, and the answer is the one the first attempt stored.
    assert len(chaos.attempts(key)) == 3
    again, _ = call(kind, chaos.url + "/charges", key, {"amount": 20})
    assert again.replayed and stored_body(again) == stored_body(answer)


def test_a_generated_key_is_reused_on_every_retry(chaos: ChaosServer, kind: str) -> None:
    chaos.plan("drop", "503")
    seen: list[Attempt] = []
    if kind == "sync":
        with httpx.Client(timeout=10) as http:
            client = IdempotentClient(http, retry=FAST)
            answer = client.post(chaos.url + "/charges", json={"n": 1}, observe=seen.append)
    else:

        async def run() -> IdempotentResponse:
            async with httpx.AsyncClient(timeout=10) as http:
                client = AsyncIdempotentClient(http, retry=FAST)
                return await client.post(chaos.url + "/charges", json={"n": 1}, observe=seen.append)

        answer = asyncio.run(run())
    assert answer.attempts == 3 and answer.replayed
    assert {a.key for a in seen} == {answer.key}
    assert [e["key"] for e in chaos.attempts(answer.key)] == [answer.key] * 3
    assert chaos.effects(answer.key) == 1


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_killed_after_the_effect_and_restarted_one_effect_and_the_stored_answer(
    chaos: ChaosServer, kind: str
) -> None:
    key = f"kill-{uuid.uuid4()}"
    chaos.plan("kill")
    assert chaos.process is not None
    restarted = threading.Event()

    def restart_when_dead() -> None:
        assert chaos.process is not None
        chaos.process.wait(timeout=30)
        time.sleep(0.5)  # the client meets a refused connection or two meanwhile
        chaos.start()
        restarted.set()

    watcher = threading.Thread(target=restart_when_dead)
    watcher.start()
    try:
        answer, seen = call(kind, chaos.url + "/charges", key, {"amount": 20}, PATIENT)
    finally:
        watcher.join(timeout=30)
    assert restarted.is_set()
    assert answer.status_code == 201 and answer.replayed
    assert isinstance(seen[0].error, httpx.RemoteProtocolError | httpx.ReadError)
    assert any(isinstance(a.error, httpx.ConnectError) for a in seen), "never met the dead server"
    assert chaos.effects(key) == 1
    assert [e["action"] for e in chaos.attempts(key)] == ["kill", "ok"]


def test_in_progress_409_is_retried_after_retry_after(chaos: ChaosServer, kind: str) -> None:
    key = f"busy-{uuid.uuid4()}"
    chaos.plan("slow-drop")
    answer, seen = call(kind, chaos.url + "/charges/slow", key, {"amount": 20})
    statuses = [a.response.status_code if a.response else None for a in seen]
    assert statuses[0] is None and 409 in statuses, statuses
    assert answer.status_code == 201 and answer.replayed
    assert chaos.effects(key) == 1
    # After each 409 (Retry-After: 1) the next attempt came at least a second later.
    for status, gap in zip(statuses, gaps(chaos, key), strict=False):
        if status == 409:
            assert gap >= 0.95, gap


@pytest.mark.parametrize("action", ["503:2", "429:2"])
def test_retry_after_seconds_is_honoured(chaos: ChaosServer, kind: str, action: str) -> None:
    key = f"later-{uuid.uuid4()}"
    chaos.plan(action)
    answer, _ = call(kind, chaos.url + "/charges", key, {"amount": 20})
    assert (answer.status_code, answer.replayed, answer.attempts) == (201, False, 2)
    [gap] = gaps(chaos, key)
    assert 1.95 <= gap <= 2 * 1.1 + 2.0, gap


def test_retry_after_http_date_is_honoured(chaos: ChaosServer, kind: str) -> None:
    key = f"date-{uuid.uuid4()}"
    chaos.plan("429:date:3")
    answer, _ = call(kind, chaos.url + "/charges", key, {"amount": 20})
    assert answer.attempts == 2
    [gap] = gaps(chaos, key)
    # An HTTP-date has a resolution of one second: at least 2 of the 3 seconds.
    assert 1.95 <= gap <= 3 * 1.1 + 2.0, gap


def test_max_attempts_is_honoured(chaos: ChaosServer, kind: str) -> None:
    key = f"max-{uuid.uuid4()}"
    chaos.plan(*["503"] * 10)
    with pytest.raises(RetriesExhausted) as raised:
        call(kind, chaos.url + "/charges", key, {"amount": 20}, FAST_3)
    error = raised.value
    assert error.attempts == 3 and error.key == key  # type: ignore[attr-defined]
    assert "max_attempts=3" in str(error) and key in str(error)
    assert len(chaos.attempts(key)) == 3
    assert chaos.effects(key) == 0


FAST_3 = Retry(
    max_attempts=3, base_backoff=timedelta(milliseconds=10), max_backoff=timedelta(seconds=0.1)
)


def test_the_deadline_is_honoured(chaos: ChaosServer, kind: str) -> None:
    key = f"deadline-{uuid.uuid4()}"
    chaos.plan(*["503:1"] * 20)
    retry = Retry(max_attempts=100, deadline=timedelta(seconds=2.5))
    started = time.monotonic()
    with pytest.raises(RetriesExhausted) as raised:
        call(kind, chaos.url + "/charges", key, {"amount": 20}, retry)
    elapsed = time.monotonic() - started
    assert "deadline" in str(raised.value)
    # Attempts at 0, >=1, >=2 s; a fourth would start after 3 s, past the deadline.
    assert 2 <= len(chaos.attempts(key)) <= 3
    assert elapsed < 2.5 + 1.5, elapsed


def test_a_stored_4xx_is_final_even_after_a_drop(chaos: ChaosServer, kind: str) -> None:
    key = f"declined-{uuid.uuid4()}"
    chaos.plan("drop")
    answer, _ = call(kind, chaos.url + "/charges", key, {"declined": True})
    assert (answer.status_code, answer.replayed, answer.attempts) == (402, True, 2)
    assert chaos.effects(key) == 1
    again, _ = call(kind, chaos.url + "/charges", key, {"declined": True})
    assert (again.status_code, again.replayed, again.attempts) == (402, True, 1)
    assert len(chaos.attempts(key)) == 3


def test_a_stored_5xx_is_final_when_replayed(chaos: ChaosServer, kind: str) -> None:
    key = f"stored-500-{uuid.uuid4()}"
    chaos.plan("drop")
    answer, _ = call(kind, chaos.url + "/charges/failing", key, {"amount": 20})
    # The 500 of the first attempt was stored: its replay is the answer, not a retry.
    assert (answer.status_code, answer.replayed, answer.attempts) == (500, True, 2)
    assert chaos.effects(key) == 1


def test_a_refused_4xx_is_final(chaos: ChaosServer, kind: str) -> None:
    key = f"invalid-{uuid.uuid4()}"
    answer, _ = call(kind, chaos.url + "/charges", key, {"invalid": True})
    assert (answer.status_code, answer.replayed, answer.attempts) == (422, False, 1)
    assert len(chaos.attempts(key)) == 1


def test_a_key_reused_for_another_request_is_a_clear_error(chaos: ChaosServer, kind: str) -> None:
    key = f"reused-{uuid.uuid4()}"
    call(kind, chaos.url + "/charges", key, {"amount": 20})
    with pytest.raises(KeyReused) as raised:
        call(kind, chaos.url + "/charges", key, {"amount": 99})
    assert key in str(raised.value) and "different request" in str(raised.value)
    assert len(raised.value.attempts_seen) == 1  # type: ignore[attr-defined]
    assert len(chaos.attempts(key)) == 2
    assert chaos.effects(key) == 1


def test_an_unreachable_server_exhausts_the_attempts(kind: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/charges"  # bound, never listening
        with pytest.raises(RetriesExhausted) as raised:
            call(kind, url, "nobody-home", {}, FAST_3)
    assert isinstance(raised.value.__cause__, httpx.ConnectError)
    assert raised.value.attempts == 3  # type: ignore[attr-defined]
