"""P11 for the operator's side: the ``idempotence`` command against a PostgreSQL that
stops and starts again (a throwaway cluster of this module's own, never the
machine's shared server).

- ``idempotence worker`` keeps running while the server is down, logs one line for
  the outage (and one when it ends), no traceback, and does its work again once the
  server is back, without a restart;
- every other command against a stopped server prints one line and exits 5 at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from idempotence import ClaimRequest
from idempotence.stores.postgres import PostgresStore
from tests.support.polling import eventually
from tests.support.postgres import ProvidedServer, throwaway_cluster

#: The slow tier: workers across a PostgreSQL restart.
pytestmark = pytest.mark.slow

CLI = Path(sys.executable).parent / "idempotence"
ROOT = Path(__file__).resolve().parents[2]
EXPIRED = timedelta(milliseconds=1)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ProvidedServer]:
    with throwaway_cluster() as server:
        with PostgresStore(server.url) as store:
            store.migrate()
        yield server


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "IDEMPOTENCE_DATABASE_URL"}


def _crashed(url: str, key: str) -> None:
    """A key whose holder died: its lock has expired, for the sweeper to release."""
    request = ClaimRequest(scope="restart", key=key, fingerprint="f" * 64, lock_timeout=EXPIRED)
    with PostgresStore(url) as store:
        assert store.claim(request).lease is not None


def _swept(url: str, key: str) -> bool:
    with PostgresStore(url) as store:
        record = store.get("restart", key)
    return record is not None and record.locked_at is None


@pytest.mark.parametrize(
    ("flavour", "mode"), [("sync", "fast"), ("async", "immediate")], ids=["sync", "async"]
)
def test_p11_the_worker_outlives_a_restart_with_one_line_per_outage(
    cluster: ProvidedServer, tmp_path: Path, flavour: str, mode: str
) -> None:
    assert cluster.halt is not None and cluster.resume is not None
    log = tmp_path / "worker.log"
    args = [str(CLI), "worker", "--database", cluster.url, "--interval", "0.2"]
    args += ["--async"] if flavour == "async" else []
    with log.open("w") as stderr:
        proc = subprocess.Popen(args, cwd=ROOT, env=_env(), stderr=stderr, text=True)
    try:
        _crashed(cluster.url, f"before-{flavour}")
        eventually(lambda: _swept(cluster.url, f"before-{flavour}"), log.read_text, interval=0.1)
        cluster.halt(mode)
        time.sleep(3.0)  # about fifteen passes of every service
        assert proc.poll() is None, log.read_text()
        cluster.resume()
        _crashed(cluster.url, f"after-{flavour}")
        eventually(
            lambda: _swept(cluster.url, f"after-{flavour}"), log.read_text, timeout=5, interval=0.1
        )
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "Traceback" not in text, text
    outage = [line for line in text.splitlines() if "PostgreSQL is unavailable" in line]
    assert len(outage) == 1, text
    assert "available again" in text, text
    assert "psycopg.pool" not in text, text


COMMANDS = [
    ["migrate"],
    ["stats"],
    ["keys", "list"],
    ["keys", "show", "restart", "k"],
    ["keys", "evict", "restart", "k"],
    ["sweep"],
    ["reap"],
    ["complete"],
    ["enqueue"],
    ["run-jobs", "--jobs", "tests.maintenance.app:jobs"],
    ["worker"],
]


@pytest.fixture(scope="module")
def stopped(cluster: ProvidedServer) -> Iterator[str]:
    assert cluster.halt is not None and cluster.resume is not None
    cluster.halt("fast")
    try:
        yield cluster.url
    finally:
        cluster.resume()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_p11_every_command_against_a_stopped_server_says_so_on_one_line_and_exits_5(
    stopped: str, command: list[str]
) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [str(CLI), *command, "--database", stopped],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 5, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "unavailable" in lines[0] and "Connection refused" in lines[0], lines
    assert elapsed < 4, elapsed  # about 1 s on an idle machine; this one is shared
