"""The Django ORM in the key's transaction (F3, issue #17 item 2): the example shop
(examples/django_shop), its settings as a Django user writes them, on PostgreSQL and
SQLite, through Django's test client and through a real WSGI server (waitress in a
subprocess).

Every Django process here is a subprocess of its own: Django's settings are
process-wide, and the suites' Django harness (tests/http/django_app.py) has its own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from idempotence import SqliteStore
from idempotence.stores._sql.ops import pending_migrations
from idempotence.stores.postgres import PostgresStore
from tests.support.postgres import settings_env

#: The slow tier: the example shop in processes of its own.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHOP = ROOT / "examples" / "django_shop"
ORDER = {"item": "tea", "quantity": 2}


@dataclass
class Shop:
    """The shop's database and the environment its processes run with."""

    backend: str
    env: dict[str, str]
    url: str  # a conninfo (PostgreSQL) or a file path (SQLite)

    def counts(self) -> tuple[int, int]:
        """(orders, keys) as committed, read on a connection of the test's own."""
        query = (
            "SELECT (SELECT count(*) FROM orders_order), (SELECT count(*) FROM idempotency_keys)"
        )
        if self.backend == "postgresql":
            with psycopg.connect(self.url) as conn:
                row = conn.execute(query).fetchone()
        else:
            with sqlite3.connect(self.url) as conn:
                row = conn.execute(query).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def store(self) -> PostgresStore | SqliteStore:
        return PostgresStore(self.url) if self.backend == "postgresql" else SqliteStore(self.url)

    def run(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args],
            cwd=SHOP,
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def migrate(self) -> None:
        done = self.run("manage.py", "migrate", "--no-input")
        assert done.returncode == 0, done.stderr


@pytest.fixture(params=["postgresql", "sqlite"])
def shop(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Shop]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), str(SHOP)]),
        "DJANGO_SETTINGS_MODULE": "tests.django_orm.settings",
    }
    if request.param == "postgresql":
        url = request.getfixturevalue("empty_pg_url")
        env |= settings_env("SHOP", url)
        yield Shop("postgresql", env, url)
    else:
        path = str(tmp_path / "shop.sqlite3")
        env.pop("SHOP_DB_HOST", None)
        yield Shop("sqlite", env | {"SHOP_DB_NAME": path}, path)


@contextmanager
def server(shop: Shop, **extra: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The shop's WSGI application under waitress, in a subprocess; yields its URL."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "waitress",
            "--listen=127.0.0.1:0",
            "--threads=40",
            "shop.wsgi:application",
        ],
        cwd=SHOP,
        env={**shop.env, **extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 30
        url = None
        while url is None:
            line = process.stdout.readline()
            if (not line and process.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"waitress did not start: {line}")
            found = re.search(r"Serving on (http://\S+)", line)
            url = found.group(1) if found else None
        threading.Thread(target=process.stdout.read, daemon=True).start()  # drain
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def post(
    url: str, key: str, body: dict[str, object] = ORDER, path: str = "/orders"
) -> httpx.Response:
    return httpx.post(
        f"{url}{path}",
        json=body,
        headers={"Idempotency-Key": key, "X-Account-Id": "acct_1"},
        timeout=30,
    )


def test_migrate_makes_the_schema_the_store_checks(shop: Shop) -> None:
    shop.migrate()
    with shop.store() as store:
        assert store._perform(pending_migrations, write=False) == []
        assert store.migrate() == []  # `idempotence migrate` finds nothing to do
    again = shop.run("manage.py", "migrate", "--no-input")
    assert again.returncode == 0 and "No migrations to apply" in again.stdout


@pytest.mark.parametrize("atomic_requests", ["0", "1"])
def test_test_client_view_writes_commit_with_the_key(shop: Shop, atomic_requests: str) -> None:
    shop.migrate()
    done = shop.run(
        "-m", "tests.django_orm.client_checks", DJANGO_ORM_ATOMIC_REQUESTS=atomic_requests
    )
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout)
    first, retry = steps["first"], steps["retry"]
    assert (first["status"], first["orders"], first["keys"]) == (201, 1, 1)
    # The retry replays the stored response; the view does not run again.
    assert (retry["status"], retry["body"], retry["replayed"]) == (201, first["body"], "true")
    assert (retry["orders"], retry["keys"]) == (1, 1)
    # A view that raises after its ORM write: everything rolled back, the claim with it,
    # so a retry runs the view again (R5) and leaves nothing either.
    for step in (steps["boom"], steps["boom_retry"]):
        assert (step["status"], step["orders"], step["keys"]) == (500, 1, 1)
    # A view that marks the request's transaction for rollback: nothing is stored, and
    # the client is told so (not the view's 201 for work that was rolled back).
    # Under ATOMIC_REQUESTS the mark rolls back only Django's per-view savepoint: the
    # order goes, and the view's own answer is stored with the key, as it chose.
    marked = steps["marked"]
    if atomic_requests == "1":
        assert (marked["status"], marked["orders"], marked["keys"]) == (201, 1, 2)
    else:
        assert (marked["status"], marked["orders"], marked["keys"]) == (500, 1, 1)
        assert "rolled back" in marked["body"]
    # Handler mode on DjangoStore (no transaction=True): claimed, run, stored, replayed.
    plain, plain_retry = steps["plain"], steps["plain_retry"]
    assert (plain["status"], plain_retry["status"], plain_retry["replayed"]) == (201, 201, "true")
    assert plain_retry["body"] == plain["body"]
    assert plain_retry["orders"] - steps["marked"]["orders"] == 1
    if shop.backend == "postgresql":
        assert steps["reconnect"] == ["unavailable", []]
    # A flow on DjangoStore: each phase's ORM write commits with its checkpoint; the
    # retry replays; a phase that raises leaves no row and its key at its point.
    assert steps["flow"] == {
        "kind": "EXECUTED",
        "items": ["confirmed", "reserved"],
        "point": "finished",
    }
    assert steps["flow_retry"]["kind"] == "REPLAYED"
    assert steps["failing"] == {
        "kind": "FAILED",
        "items": ["confirmed", "reserved"],
        "point": "started",
    }


def test_crash_after_the_orm_write_leaves_nothing_and_the_retry_runs_once(shop: Shop) -> None:
    shop.migrate()
    with server(shop, DJANGO_ORM_CRASH="1") as (url, process):
        with pytest.raises(httpx.TransportError):
            post(url, "k-crash")  # the server dies inside the request's transaction
        assert process.wait(timeout=30) == -signal.SIGKILL
    assert shop.counts() == (0, 0)  # no order, no key
    with server(shop) as (url, _):
        first = post(url, "k-crash")
        retry = post(url, "k-crash")
    assert first.status_code == 201
    assert (retry.status_code, retry.text) == (201, first.text)
    assert retry.headers.get("idempotent-replayed") == "true"
    assert shop.counts() == (1, 1)


def test_32_concurrent_duplicates_commit_once(shop: Shop) -> None:
    shop.migrate()
    barrier = threading.Barrier(32)
    responses: list[httpx.Response] = []

    def one(url: str) -> None:
        barrier.wait()
        responses.append(post(url, "k-burst"))

    with server(shop) as (url, _):
        threads = [threading.Thread(target=one, args=(url,)) for _ in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    statuses = sorted(response.status_code for response in responses)
    assert len(statuses) == 32
    assert shop.counts() == (1, 1), statuses  # one order, whatever the others got
    created = [response for response in responses if response.status_code == 201]
    assert created and {response.text for response in created} == {created[0].text}
    # The others replayed it, or were told it was in progress (409, F8).
    assert set(statuses) <= {201, 409}, statuses
    print(f"{shop.backend}: statuses {statuses}")


def test_a_twin_of_a_running_view(shop: Shop) -> None:
    """F8 on Django's connection: on PostgreSQL a twin that arrives while the first
    request's transaction is open waits for its row lock only briefly, and is answered
    409; on SQLite it waits for the one write lock, then replays. One order either way."""
    shop.migrate()
    with server(shop) as (url, _):
        first: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: first.append(post(url, "k-slow", path="/slow")))
        thread.start()
        time.sleep(0.4)  # the first request is inside its view, its transaction open
        started = time.monotonic()
        twin = post(url, "k-slow", path="/slow")
        waited = time.monotonic() - started
        thread.join(timeout=30)
    assert first[0].status_code == 201
    if shop.backend == "postgresql":
        assert twin.status_code == 409 and waited < 0.5, (twin.status_code, waited)
    else:
        assert (twin.status_code, twin.text) == (201, first[0].text)
        assert twin.headers.get("idempotent-replayed") == "true"
    assert shop.counts() == (1, 1)


def test_sqlite_without_immediate_transactions_refuses_to_start(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), str(SHOP)]),
        "DJANGO_SETTINGS_MODULE": "tests.django_orm.settings",
        "SHOP_DB_NAME": str(tmp_path / "shop.sqlite3"),
        "DJANGO_ORM_DEFERRED": "1",
    }
    env.pop("SHOP_DB_HOST", None)
    done = subprocess.run(
        [sys.executable, "-c", "import shop.wsgi"],
        cwd=SHOP,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "ConfigurationError" in done.stderr and '"transaction_mode": "IMMEDIATE"' in done.stderr
