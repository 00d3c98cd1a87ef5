"""The demo itself, as a user runs it: ``python -m rocket_rides … --json`` in a
subprocess, on SQLite and PostgreSQL, without and with heavy crash injection.

Exit status 0 means every invariant held; the report's numbers are checked too, so
a demo that silently did nothing cannot pass.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pika
import pika.exceptions
import pytest

from rocket_rides.run import free_port
from tests.consumers.broker import broker_url
from tests.demo.conftest import assert_group_gone

RIDES, CLIENTS = 60, 4


def run_demo(*args: str) -> tuple[int, dict]:
    process = subprocess.run(
        [
            # The console script the README tells a new user to run.
            os.path.join(os.path.dirname(sys.executable), "idempotence"),
            "demo",
            "--rides",
            str(RIDES),
            "--clients",
            str(CLIENTS),
            "--seed",
            "7",
            "--json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = process.stdout.strip().splitlines()
    assert len(lines) == 1, process.stdout + process.stderr
    return process.returncode, json.loads(lines[0])


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> list[str]:
    if request.param == "sqlite":
        return []  # the default: SQLite in a temporary directory
    return ["--database", request.getfixturevalue("empty_pg_url")]


@pytest.mark.parametrize("crash_rate", [None, "0.3"], ids=["default-crash-rate", "crash-rate-0.3"])
def test_the_demo_proves_exactly_once(database: list[str], crash_rate: str | None):
    # With crashes, clients also walk away from some rides: the completer's to finish.
    chaos = ["--crash-rate", crash_rate, "--abandon-rate", "0.2"] if crash_rate else []
    args = [*database, *chaos]

    status, report = run_demo(*args)

    assert status == 0, report["violations"]
    assert report["ok"] is True and report["violations"] == []
    # Every ride is booked, but those whose client walked away before the service
    # ever kept its key: those must have left nothing at all.
    unclaimed = report["rides_never_claimed"]
    assert report["rides_requested"] == RIDES
    assert report["rides_created"] == RIDES - unclaimed
    assert report["double_charges"] == 0 and report["duplicate_receipts"] == 0
    assert report["charges"] == report["rides_created"]  # declined ones included
    assert report["receipts"] == report["rides_paid"] > 0
    states = report["keys_by_state"]
    # A key whose client walked away before the claim has no row: "never claimed".
    assert set(states) <= {"complete", "failed", "never claimed"}
    assert states.get("never claimed", 0) == unclaimed
    assert sum(states.values()) == RIDES
    assert report["backend"] == ("postgres" if database else "sqlite")
    assert "messages_published" not in report  # no broker: receipts by the mailer
    if crash_rate:
        # The crashes happened, and the retries took the keys of dead workers over.
        assert report["worker_crashes"] > 5
        assert report["restarts"] >= report["worker_crashes"]
        assert report["lock_takeovers"] > 0
        assert report["rides_abandoned"] > 0 and report["completer_resumed"] > 0


def test_receipts_through_rabbitmq_are_sent_once_through_consumer_kills_and_duplicates(
    database: list[str],
):
    # DESIGN 9 (M1, M2) in the demo: receipts published to the real broker, some twice
    # on purpose, consumed by guarded consumers that are SIGKILLed before the claim,
    # inside the transaction and after the commit before the ack.
    url = broker_url()
    chaos = ["--crash-rate", "0.3", "--duplicate-rate", "0.5", "--abandon-rate", "0"]

    status, report = run_demo(*database, "--broker", url, *chaos)

    assert status == 0, report["violations"]
    paid = report["rides_paid"]
    assert paid > 0 and report["receipts"] == paid
    assert report["duplicate_receipts"] == 0 and report["missing_receipts"] == 0
    # Every receipt went over the broker, some twice; the consumers died, their
    # deliveries came back, and every second copy was absorbed, not sent again.
    assert report["messages_published"] >= paid + report["duplicates_published"]
    assert report["duplicates_published"] > 0
    assert report["duplicates_absorbed"] >= report["duplicates_published"]
    assert report["consumers_killed"] > 0 and report["messages_redelivered"] > 0
    # The run's queues were its own, and are gone.
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for suffix in ("", ".delay", ".dead"):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="NOT_FOUND"):
                connection.channel().queue_declare(report["broker_queue"] + suffix, passive=True)
    finally:
        connection.close()


def test_the_table_report_and_the_exit_status(tmp_path):
    process = subprocess.run(
        [
            # The console script the README tells a new user to run.
            os.path.join(os.path.dirname(sys.executable), "idempotence"),
            "demo",
            "--rides",
            "10",
            "--clients",
            "2",
            "--crash-rate",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert process.returncode == 0, process.stdout + process.stderr
    assert "rides requested" in process.stdout and "double charges" in process.stdout
    assert process.stdout.rstrip().splitlines()[-1].startswith("OK:")
    # The command that runs the same workload again: the options given, and the seed
    # the run drew, as none was given.
    rerun = re.search(r"^  (idempotence demo .*)$", process.stdout, re.MULTILINE)
    assert rerun is not None, process.stdout
    assert re.fullmatch(
        r"idempotence demo --rides 10 --clients 2 --crash-rate 0\.0 --seed \d+", rerun.group(1)
    )
    assert "lock takeovers" not in process.stdout and "fenced" not in process.stdout
    # stderr is no terminal here: the progress is lines, the last one the total.
    assert "booking 10 rides" in process.stderr
    assert "booked 10/10 rides in" in process.stderr
    # The data directory was asked for, so it is kept: the databases and the log.
    kept = {path.name for path in (tmp_path / "data").iterdir()}
    assert {"rides.sqlite3", "provider.sqlite3", "mailer.sqlite3", "processes.log"} <= kept


def test_serve_runs_until_stopped_and_leaves_nothing_behind(tmp_path):
    port, provider_port = free_port(), free_port()
    process = subprocess.Popen(
        [
            # The console script the README tells a new user to run.
            os.path.join(os.path.dirname(sys.executable), "idempotence"),
            "demo",
            "serve",
            "--port",
            str(port),
            "--provider-port",
            str(provider_port),
            "--data-dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        ride = {"origin_lat": 1, "origin_lon": 2, "target_lat": 3, "target_lon": 4}
        headers = {"Authorization": "Bearer user-5", "Idempotency-Key": "serve-1"}
        response = httpx.post(f"http://127.0.0.1:{port}/v1/rides", json=ride, headers=headers)
        assert response.status_code == 201
        # serve never honours the demo's crash orders
        headers["X-Demo-Crash"] = "respond"
        again = httpx.post(f"http://127.0.0.1:{port}/v1/rides", json=ride, headers=headers)
        assert again.headers["idempotent-replayed"] == "true"

        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        assert_group_gone(process.pid)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        assert process.stderr is not None
        process.stderr.close()


def _serve(tmp_path, port: int, provider_port: int, log) -> subprocess.Popen:
    return subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "idempotence"),
            "demo",
            "serve",
            *("--port", str(port), "--provider-port", str(provider_port)),
            *("--data-dir", str(tmp_path / "data")),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_prints_its_banner_once_up_and_stops_quietly(tmp_path, sig):
    """#16: the banner came before the processes were up, and stopping the stack
    reported each of them as ``died: signal 15``."""
    port, provider_port = free_port(), free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        process = _serve(tmp_path, port, provider_port, stderr)
    try:
        deadline = time.monotonic() + 30
        while "Rocket Rides API" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        # Announced: both servers answer at once.
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        provider = httpx.get(f"http://127.0.0.1:{provider_port}/v1/charges/ch_none")
        assert provider.status_code < 500
        if sig == signal.SIGINT:
            os.killpg(process.pid, sig)  # Ctrl-C: the terminal signals the whole group
        else:
            process.send_signal(sig)
        assert process.wait(30) == 0, log.read_text()
        assert_group_gone(process.pid)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = log.read_text()
    assert text.count("Rocket Rides API") == 1, text
    assert "died" not in text, text
    assert "Traceback" not in text, text


def test_serve_on_a_port_in_use_says_so_on_one_line(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "serve.log"
        with log.open("w") as stderr:
            process = _serve(tmp_path, port, free_port(), stderr)
        try:
            code = process.wait(30)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    lines = log.read_text().strip().splitlines()
    assert code == 1, lines
    assert len(lines) == 1 and f"port {port}" in lines[0] and "in use" in lines[0], lines


def test_serve_on_an_unreachable_database_says_why_without_a_traceback(tmp_path):
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [
                os.path.join(os.path.dirname(sys.executable), "idempotence"),
                "demo",
                "serve",
                *("--port", str(free_port()), "--provider-port", str(free_port())),
                *("--database", "postgresql://postgres@127.0.0.1:1/nothing"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        code = process.wait(60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = log.read_text()
    assert code == 1, text
    assert "Traceback" not in text, text
    assert "Rocket Rides API" not in text, text  # no banner: nothing came up
    errors = [line for line in text.splitlines() if line.startswith("StoreUnavailable")]
    assert len(errors) == 1 and "Connection refused" in errors[0], text
    assert text.rstrip().endswith("setup failed to start: see the line above"), text
