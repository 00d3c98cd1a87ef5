"""Asynchronous acceptance (``Policy(asynchronous=True)``) through a real server
(uvicorn in a process of its own, tests/http/chaos_server.py): a long flow answers 202
with its status URL and Retry-After; retries and GETs of the status URL answer 202
until it finishes, then its stored response. Killed mid-flow, the server leaves the
key to the completer (B2), which finishes it; the status URL then answers the stored
response, and the effect happened once.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from idempotence import AsyncSqliteStore
from idempotence.flows import Finish, Flow, FlowRegistry, PhaseContext
from idempotence.http import Endpoint, Policy
from idempotence.maintenance import AsyncCompleter
from idempotence.maintenance.completer import CompleterConfig
from idempotence.states import StoredResponse
from idempotence.stores.postgres import AsyncPostgresStore
from tests.http import chaos_server
from tests.http.apps import FRAMEWORKS
from tests.http.test_client import ChaosServer, chaos

#: The slow tier: asynchronous operations through real servers.
pytestmark = pytest.mark.slow

__all__ = ["chaos"]


def post(server: ChaosServer, key: str, pages: int = 3) -> httpx.Response:
    return httpx.post(
        server.url + "/reports", json={"pages": pages}, headers={"idempotency-key": key}
    )


def assert_accepted(response: httpx.Response, key: str) -> str:
    assert response.status_code == 202, response.text
    location = response.headers["location"]
    assert location == f"/idempotence/operations/{key}"
    assert response.headers["content-location"] == location
    assert int(response.headers["retry-after"]) >= 1
    assert response.json()["idempotency_key"] == key
    return location


def test_202_until_the_flow_finishes_then_the_stored_response(chaos: ChaosServer) -> None:
    key = f"report-{uuid.uuid4()}"
    started = time.monotonic()
    location = assert_accepted(post(chaos, key), key)
    assert time.monotonic() - started < chaos_server.REPORT_TIME  # did not wait for it
    # While it runs: a retry and the status URL both answer 202, and run nothing.
    assert_accepted(post(chaos, key), key)
    assert_accepted(httpx.get(chaos.url + location), key)
    # Another request with the key is refused, as ever (P2).
    other = post(chaos, key, pages=99)
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    done = wait_for_answer(chaos.url + location)
    assert done.status_code == 201 and done.headers["idempotent-replayed"] == "true"
    assert done.json()["pages"] == 3
    replay = post(chaos, key)
    assert (replay.status_code, replay.content) == (201, done.content)
    assert chaos.effects(key) == 1


def test_an_unknown_operation_is_404(chaos: ChaosServer) -> None:
    response = httpx.get(chaos.url + "/idempotence/operations/never-sent")
    assert response.status_code == 404
    assert response.json()["code"] == "idempotency_operation_unknown"
    # A key of a synchronous endpoint is no operation to read.
    key = f"charge-{uuid.uuid4()}"
    httpx.post(chaos.url + "/charges", json={"amount": 1}, headers={"idempotency-key": key})
    assert httpx.get(chaos.url + f"/idempotence/operations/{key}").status_code == 404


def test_killed_mid_flow_the_completer_finishes_it(
    chaos: ChaosServer, backend: str, target: str
) -> None:
    key = f"report-crash-{uuid.uuid4()}"
    (chaos.directory / "hang").touch()
    location = assert_accepted(post(chaos, key), key)
    deadline = time.monotonic() + 20
    while not (chaos.directory / "reached").exists():
        assert time.monotonic() < deadline, "the flow never reached its hang point"
        time.sleep(0.02)
    chaos.stop()  # SIGKILL, mid-flow: the first phase has committed, the second has not
    (chaos.directory / "hang").unlink()
    chaos.start()
    # The restarted server does not run it: a retry and the status URL say 202.
    assert_accepted(httpx.get(chaos.url + location), key)
    assert_accepted(post(chaos, key), key)
    completed = asyncio.run(complete(backend, target, chaos.directory, key))
    assert completed, "the completer never finished the key"
    done = httpx.get(chaos.url + location)
    assert done.status_code == 201 and done.json()["pages"] == 3
    replay = post(chaos, key)
    assert (replay.status_code, replay.content) == (201, done.content)
    assert chaos.effects(key) == 1


async def complete(backend: str, target: str, directory: Path, key: str) -> bool:
    """Run the completer until it has finished ``key`` (once the dead run's lock lapses)."""
    flows = FlowRegistry()
    flows.register(chaos_server.report_flow(backend, directory))
    store: Any = AsyncPostgresStore(target) if backend == "postgres" else AsyncSqliteStore(target)
    config = CompleterConfig(grace=timedelta(0))
    async with store:
        completer = AsyncCompleter(store, config, flows=flows)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            result = await completer.run_once()
            if any(c.key == key and c.outcome.value == "completed" for c in result.completions):
                return True
            await asyncio.sleep(0.2)
    return False


def wait_for_answer(url: str) -> httpx.Response:
    deadline = time.monotonic() + 20
    while True:
        response = httpx.get(url)
        if response.status_code != 202:
            return response
        assert time.monotonic() < deadline, "the operation never finished"
        time.sleep(float(response.headers["retry-after"]) / 4)


# -- every framework, both stores: the background run is a task (ASGI) or a thread (WSGI) --

quick = Flow("http-test-accept")
QUICK_RUNS: list[str] = []


@quick.phase("started")
def _quick(ctx: PhaseContext) -> Finish:
    QUICK_RUNS.append(ctx.lease.key)
    time.sleep(0.3)  # long enough for a read to find it running, now and then
    body = json.dumps({"report": ctx.lease.key, "pages": ctx.params["pages"]})
    return Finish(StoredResponse.of(201, {"content-type": "application/json"}, body))


@pytest.fixture(params=FRAMEWORKS)
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_accepted_then_answered_on_every_framework(make_harness: Any) -> None:
    key = f"quick-{uuid.uuid4()}"
    endpoints = [Endpoint("POST /reports", Policy(flow=quick, asynchronous=True))]
    with make_harness(endpoints=endpoints) as harness:
        first = harness.post("/reports", {"pages": 2}, key=key)
        assert first.status == 202, first.body
        location = first.header("location")
        assert location == f"/idempotence/operations/{key}"
        deadline = time.monotonic() + 20
        while (status := harness.get(location)).status == 202:
            assert time.monotonic() < deadline, "the operation never finished"
            time.sleep(0.05)
        assert status.status == 201 and status.json()["pages"] == 2
        assert status.header("idempotent-replayed") == "true"
        replay = harness.post("/reports", {"pages": 2}, key=key)
        assert (replay.status, replay.body) == (201, status.body)
        # Another tenant has no such operation.
        assert harness.get(location, tenant=harness.tenant + "-2").status == 404
    assert QUICK_RUNS.count(key) == 1
