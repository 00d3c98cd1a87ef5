"""Fixtures for the demo suites: a running Rocket Rides service on each backend.

The service is the real thing: the stack supervisor in a process of its own, forking
the provider, an API worker (uvicorn, chaos hooks enabled so that tests can hold a key
in progress or kill the worker) and the background worker, on free ports of
127.0.0.1. It is started once per module and backend, and stopped, with every process
it started, at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rocket_rides.run import StackProcess, free_port, start_stack
from rocket_rides.stack import StackConfig
from tests.support.polling import eventually
from tests.support.postgres import ProvidedServer, create_database, drop_database

#: A short lock timeout: the crash tests wait it out.
LOCK_TIMEOUT = 1.0


@dataclass(frozen=True)
class Service:
    """A running Rocket Rides: its API and its provider."""

    api: str
    provider: str
    backend: str
    stack: StackProcess

    def charges(self, key: str) -> list[dict]:
        """The provider's charges made for Idempotency-Key ``key``."""
        data = httpx.get(self.provider + "/v1/charges").raise_for_status().json()["data"]
        return [c for c in data if (c["reference"] or "").endswith("/" + key)]


def assert_group_gone(pgid: int, timeout: float = 5.0) -> None:
    """No process of the group ``pgid`` is left (the supervisor and its children)."""

    def gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    eventually(gone, f"no process of group {pgid} is left", timeout=timeout, interval=0.05)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    backend = request.param
    data = tmp_path_factory.mktemp(f"rides-{backend}")
    server: ProvidedServer | None = None
    if backend == "postgres":
        server = request.getfixturevalue("pg_server")
        database = create_database(server.url, prefix="idempotence_demo")
    else:
        database = f"sqlite:///{data}/rides.sqlite3"
    config = StackConfig(
        database=database,
        data_dir=str(data),
        api_ports=(free_port(),),
        provider_port=free_port(),
        chaos=True,
        lock_timeout=LOCK_TIMEOUT,
        completer_grace=30.0,
    )
    try:
        with open(Path(data) / "processes.log", "wb") as log, start_stack(config, log) as stack:
            yield Service(
                api=f"http://127.0.0.1:{config.api_ports[0]}",
                provider=config.provider_url,
                backend=backend,
                stack=stack,
            )
        assert_group_gone(stack.process.pid)
    finally:
        if server is not None:
            drop_database(server.url, database)


@pytest.fixture
def api(service: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.api, timeout=15.0) as client:
        yield client


@pytest.fixture
def key() -> str:
    """A fresh Idempotency-Key."""
    return f"test-{uuid.uuid4().hex[:16]}"
