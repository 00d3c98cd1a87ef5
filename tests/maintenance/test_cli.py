"""Acceptance: the maintenance commands of the installed ``idempotence`` script, run in
a subprocess against real databases. Exit 0 on success, 1 when the store or the work
fails, 2 for a usage error, 3 for differences found, 4 for a key not found, 5 when the
store is unavailable."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.maintenance.app import async_checkout, checkout
from tests.maintenance.support import EXPIRED, Backend, claim, finished, new_scope, pending

CLI = Path(sys.executable).parent / "idempotence"
ROOT = Path(__file__).resolve().parents[2]
APP = "tests.maintenance.app"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "IDEMPOTENCE_DATABASE_URL"}
    return subprocess.run(
        [str(CLI), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def ok(*args: str) -> str:
    result = run(*args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def http_get(port: int, path: str) -> str:
    """A bare HTTP GET (urllib would import ``http``, which tests/http can shadow)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def abandon(db: Backend, scope: str, key: str) -> None:
    """A checkout key whose request died before its first phase."""
    lease = db.store.claim(checkout.request(scope=scope, key=key, fingerprint="f" * 64)).lease
    assert lease is not None
    db.store.release(lease)


# -- one pass of each service ---------------------------------------------------------------


def test_cli_sweep(db: Backend) -> None:
    scope = new_scope()
    for i in range(3):
        claim(db.store, scope, f"k{i}", lock_timeout=EXPIRED)
    time.sleep(0.02)
    assert ok("sweep", "--database", db.url, "--batch-size", "2").strip() == (
        "swept 3 expired lock(s) in 2 batch(es)"
    )
    data = json.loads(ok("sweep", "--database", db.url, "--json"))
    assert (data["swept"], data["batches"]) == ([], 1)


def test_cli_complete_resumes_through_the_apps_flows(db: Backend) -> None:
    scope = new_scope()
    abandon(db, scope, "a")
    abandon(db, scope, "b")
    pending(db.store, scope, "orphan", flow="not_in_the_app")
    out = ok("complete", "--database", db.url, "--flows", f"{APP}:flows", "--grace", "0")
    assert out.strip() == (
        "resumed 2 abandoned key(s): 2 completed; 1 key(s) of unregistered flows left alone"
    )
    record = db.store.get(scope, "a")
    assert record is not None and record.response is not None
    assert record.response.status == 201


def test_cli_reap(db: Backend) -> None:
    scope = new_scope()
    for i in range(4):
        finished(db.store, scope, f"k{i}")
    db.backdate(scope, None, timedelta(days=2), "created_at", "finished_at", "expires_at")
    data = json.loads(ok("reap", "--database", db.url, "--json"))
    assert data["deleted"] == 4
    assert ok("reap", "--database", db.url).startswith("deleted 0 expired key(s)")


def test_cli_enqueue_and_run_jobs(db: Backend) -> None:
    scope = new_scope()
    checkout.run(db.store, checkout.request(scope=scope, key="k", fingerprint="f" * 64))
    assert ok("enqueue", "--database", db.url).startswith("delivered 1 staged job(s)")
    out = ok("run-jobs", "--database", db.url, "--jobs", f"{APP}:jobs")
    assert out.strip() == "ran 1 job(s): 1 done, 0 to retry, 0 dead"


# -- keys and stats -------------------------------------------------------------------------


def test_cli_keys_list_show_and_filter(db: Backend) -> None:
    scope = new_scope()
    finished(db.store, scope, "paid", status=201)
    finished(db.store, scope, "declined", status=402)
    finished(db.store, scope, "unknown", error="timeout at the bank")

    table = ok("keys", "list", "--database", db.url).splitlines()
    assert table[0].split() == [
        "SCOPE",
        "KEY",
        "STATE",
        "FLOW",
        "POINT",
        "CALLING",
        "STATUS",
        "AGE",
        "TOKEN",
    ]
    assert [line.split()[1:3] for line in table[1:]] == [
        ["unknown", "errored"],
        ["declined", "failed"],
        ["paid", "complete"],
    ]
    errored = json.loads(ok("keys", "list", "--database", db.url, "--state", "errored", "--json"))
    assert [(k["key"], k["state"], k["error"]) for k in errored] == [
        ("unknown", "errored", "timeout at the bank")
    ]
    limited = json.loads(ok("keys", "list", "--database", db.url, "--limit", "1", "--json"))
    assert len(limited) == 1

    shown = json.loads(ok("keys", "show", "--database", db.url, scope, "declined", "--json"))
    assert shown["state"] == "failed"
    assert shown["response"] == {"status": 402, "headers": [], "body": "{}"}
    detail = ok("keys", "show", "--database", db.url, scope, "paid")
    assert "response.status     201" in detail


def test_cli_keys_list_and_show_name_the_call_a_worker_died_in(db: Backend) -> None:
    """R6: the non-idempotent call begun and never recorded is its own field, next to
    the step's own recovery point."""
    scope = new_scope()
    lease = claim(db.store, scope, "crashed").lease
    assert lease is not None
    with db.store.transaction() as tx:
        db.store.checkpoint(tx, lease, "ride_created", calling="charge")
    finished(db.store, scope, "paid", status=201)

    listed = json.loads(ok("keys", "list", "--database", db.url, "--scope", scope, "--json"))
    assert {k["key"]: (k["recovery_point"], k["calling"]) for k in listed} == {
        "crashed": ("ride_created", "charge"),
        "paid": ("finished", None),
    }
    table = ok("keys", "list", "--database", db.url, "--scope", scope).splitlines()
    rows = {line.split()[1]: line.split() for line in table[1:]}
    assert rows["crashed"][4:6] == ["ride_created", "charge"]
    assert rows["paid"][4:6] == ["finished", "-"]
    detail = ok("keys", "show", "--database", db.url, scope, "crashed")
    assert "calling             charge" in detail


@pytest.mark.parametrize("command", ["show", "evict"])
def test_cli_keys_of_a_missing_key_exit_4_not_found(db: Backend, command: str) -> None:
    # 4 is "not found", apart from 1 ("the store failed"), so a script can tell them apart.
    result = run("keys", command, "--database", db.url, "nobody", "nothing")
    assert result.returncode == 4, result.stderr
    assert "no key 'nothing' in scope 'nobody'" in result.stderr


def test_cli_keys_evict_refuses_a_live_lock_unless_forced(db: Backend) -> None:
    scope = new_scope()
    claim(db.store, scope, "busy")
    refused = run("keys", "evict", "--database", db.url, scope, "busy")
    assert refused.returncode == 1
    assert "being processed" in refused.stderr and "--force" in refused.stderr
    assert db.store.get(scope, "busy") is not None

    out = ok("keys", "evict", "--database", db.url, scope, "busy", "--force")
    assert out.strip() == f"evicted key 'busy' in scope '{scope}' (it was processing)"
    assert db.store.get(scope, "busy") is None


def test_cli_keys_evict_with_cache_refuses_the_cached_response_first(
    db: Backend, redis_url: str, redis_prefix: str
) -> None:
    from idempotence import ClaimRequest, StoredResponse
    from idempotence.stores.cached import CachedStore

    scope = new_scope()
    request = ClaimRequest(scope=scope, key="paid", fingerprint="f" * 64)
    cached = CachedStore(db.store, redis_url, prefix=redis_prefix)
    cached.finish(cached.claim(request).lease, StoredResponse.of(201, body="first"))
    assert cached.claim(request).response.body == b"first"
    hits = cached.cache_stats.hits

    def evict(cache: str) -> list[str]:
        return ["keys", "evict", "--database", db.url, scope, "paid", "--cache", cache,
                "--cache-prefix", redis_prefix]  # fmt: skip

    # A cache that cannot be reached: exit 5 (unavailable), and nothing is evicted.
    down = run(*evict("redis://127.0.0.1:1/0"))
    assert down.returncode == 5, down.stderr
    assert "nothing was evicted" in down.stderr
    assert db.store.get(scope, "paid") is not None

    out = ok(*evict(redis_url))
    assert out.strip() == f"evicted key 'paid' in scope '{scope}' (it was complete)"
    # The next request runs afresh: not the cached replay of the evicted row.
    assert cached.claim(request).lease.token == 1
    assert cached.cache_stats.hits == hits


def test_cli_keys_evict_with_an_unreachable_cache_prints_one_error_line(db: Backend) -> None:
    # An operator paged at night reads one line saying what failed, not a warning
    # about answering from the primary (which the eviction does not do) before it.
    scope = new_scope()
    finished(db.store, scope, "paid")
    down = run("keys", "evict", "--database", db.url, scope, "paid",
               "--cache", "redis://127.0.0.1:1/0")  # fmt: skip
    assert down.returncode == 5, down.stderr
    assert "WARNING" not in down.stderr
    [line] = down.stderr.splitlines()
    assert line.startswith("Error: the Redis cache cannot be reached")
    assert "nothing was evicted" in line


def test_cli_stats(db: Backend) -> None:
    scope = new_scope()
    pending(db.store, scope, "waiting")
    finished(db.store, scope, "done")
    data = json.loads(ok("stats", "--database", db.url, "--json"))
    assert data["states"] == {
        "pending": 1,
        "processing": 0,
        "complete": 1,
        "failed": 0,
        "errored": 0,
        "expired": 0,
    }
    assert data["total"] == 2
    assert data["oldest_pending_age_seconds"] >= 0
    text = ok("stats", "--database", db.url)
    assert "oldest pending" in text and "lock takeovers   0" in text


# -- the worker -------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cli_worker_runs_every_service_until_a_signal(db: Backend, sig: signal.Signals) -> None:
    scope = new_scope()
    abandon(db, scope, "resume-me")
    claim(db.store, scope, "crashed", lock_timeout=EXPIRED)
    args = ["worker", "--database", db.url, "--flows", f"{APP}:flows", "--jobs", f"{APP}:jobs"]
    env = {k: v for k, v in os.environ.items() if k != "IDEMPOTENCE_DATABASE_URL"}
    proc = subprocess.Popen(
        [str(CLI), *args, "--interval", "0.1", "--grace", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while db.count("idempotence_jobs", "status = 'done'") < 1:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the worker did not resume and run the job"
            time.sleep(0.1)
        crashed = db.store.get(scope, "crashed")
        assert crashed is not None and crashed.locked_at is None  # swept
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert "received: stopping" in stderr
    assert "worker stopped" in stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cli_worker_b2_f7_completes_a_key_of_an_async_flow(
    db: Backend, sig: signal.Signals
) -> None:
    """The application's flows have coroutine steps: the worker sees it, runs the
    services on an async store, and its completer drives the abandoned key to its
    terminal state (B2, F7); its runner then runs the receipt job; a signal stops it."""
    scope = new_scope()
    request = async_checkout.request(scope=scope, key="async", fingerprint="f" * 64)
    lease = db.store.claim(request).lease
    assert lease is not None
    db.store.release(lease)  # the client died before the first phase
    args = [
        "worker",
        "--database",
        db.url,
        "--flows",
        f"{APP}:async_flows",
        "--jobs",
        f"{APP}:jobs",
    ]
    env = {k: v for k, v in os.environ.items() if k != "IDEMPOTENCE_DATABASE_URL"}
    proc = subprocess.Popen(
        [str(CLI), *args, "--interval", "0.1", "--grace", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while db.count("idempotence_jobs", "status = 'done'") < 1:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the worker did not resume the async flow"
            time.sleep(0.1)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    record = db.store.get(scope, "async")
    assert record is not None and record.finished and record.response is not None
    assert record.response.status == 201
    assert json.loads(record.response.body) == {
        "charge": async_checkout.key_for(record.id, "charge")
    }
    assert (db.row(scope, "async") or {}).get("completer_attempts") == 1
    assert "running on an async store" in stderr
    assert "worker stopped" in stderr
    assert "Traceback" not in stderr


def test_cli_complete_f7_resumes_an_async_flow(db: Backend) -> None:
    scope = new_scope()
    lease = db.store.claim(async_checkout.request(scope=scope, key="k", fingerprint="f" * 64)).lease
    assert lease is not None
    db.store.release(lease)

    out = ok("complete", "--database", db.url, "--flows", f"{APP}:async_flows", "--grace", "0")

    assert "1 completed" in out
    record = db.store.get(scope, "k")
    assert record is not None and record.response is not None
    assert record.response.status == 201


def test_cli_worker_serves_metrics(db: Backend) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "IDEMPOTENCE_DATABASE_URL"}
    abandon(db, new_scope(), "metered")  # the completer's claim is counted too
    args = ["worker", "--database", db.url, "--interval", "0.1", "--metrics-port", str(port)]
    args += ["--flows", f"{APP}:flows", "--grace", "0"]
    # Asked of a fresh interpreter, as the command sees it: in this one, tests/http can
    # shadow the standard library's http, which prometheus_client imports.
    probe = subprocess.run([sys.executable, "-c", "import prometheus_client"], check=False)
    if probe.returncode != 0:
        result = run(*args)
        assert result.returncode == 2
        assert "idempotence[metrics]" in result.stderr
        return
    proc = subprocess.Popen([str(CLI), *args], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                body = http_get(port, "/metrics")
                if (
                    'idempotence_maintenance_passes_total{service="reaper"}' in body
                    and 'idempotence_claims_total{outcome="execute"} 1.0' in body
                ):
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no metrics served"
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.communicate(timeout=15)
    assert proc.returncode == 0


# -- usage errors and failures ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["complete", "--flows", "no_such_module:flows"], "cannot import"),
        (["complete", "--flows", f"{APP}:missing"], "cannot import"),
        (["complete", "--flows", "no-colon"], "MODULE:ATTRIBUTE"),
        (["complete", "--flows", f"{APP}:not_a_registry"], "FlowRegistry"),
        (["worker", "--jobs", f"{APP}:flows"], "JobRegistry"),
        (["keys", "list", "--state", "sleeping"], "'sleeping' is not one of"),
        (["keys", "list", "--limit", "0"], "--limit"),
        (["sweep", "--batch-size", "0"], "--batch-size"),
    ],
)
def test_cli_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = run(*args, "--database", f"sqlite:///{tmp_path}/x.db")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


def test_cli_a_missing_database_is_a_usage_error() -> None:
    result = run("stats")
    assert result.returncode == 2
    assert "--database" in result.stderr


def test_cli_an_unreachable_store_exits_5_unavailable() -> None:
    result = run("stats", "--database", "postgresql://postgres@127.0.0.1:1/x")
    assert result.returncode == 5
    assert "unavailable" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_an_unmigrated_store_says_to_migrate(tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "empty.db").close()
    result = run("sweep", "--database", f"sqlite:///{tmp_path}/empty.db")
    assert result.returncode == 1
    assert "idempotence migrate" in result.stderr


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_cli_worker_on_an_unmigrated_store_exits_at_once_saying_to_migrate(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # A missing schema is no passing fault: no pass can succeed until someone migrates.
    if backend == "postgres":
        url = request.getfixturevalue("empty_pg_url")
    else:
        sqlite3.connect(tmp_path / "empty.db").close()
        url = f"sqlite:///{tmp_path}/empty.db"
    started = time.monotonic()
    result = run("worker", "--database", url, timeout=30)
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - started < 10
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "run `idempotence migrate --database URL`" in result.stderr


# -- reconcile (B5) ---------------------------------------------------------------------------


def test_cli_reconcile_prints_the_differences_and_exits_3() -> None:
    # Exit status 3 says "differences found", so a cron job can alert on it.
    found = run("reconcile", "rides", "--since", "24h", "--reconcilers", f"{APP}:reconcilers")
    assert found.returncode == 3, found.stderr
    out = found.stdout
    assert "2 matched, 1 foreign without local, 1 local without foreign" in out
    assert "foreign without local: a" in out
    assert "local without foreign: d" in out
    as_json = run(
        "reconcile",
        "rides",
        "--since",
        "2024-01-01",
        "--reconcilers",
        f"{APP}:reconcilers",
        "--json",
    )
    assert as_json.returncode == 3
    data = json.loads(as_json.stdout)
    assert (data["foreign_only"], data["local_only"], data["matched"]) == (["a"], ["d"], 2)


def test_cli_reconcile_clean_window_exits_0() -> None:
    out = ok("reconcile", "receipts", "--since", "1h", "--reconcilers", f"{APP}:reconcilers")
    assert "2 matched, 0 foreign without local, 0 local without foreign" in out


def test_cli_reconcile_an_unknown_flow_or_time_is_a_usage_error() -> None:
    unknown = run("reconcile", "taxis", "--since", "1h", "--reconcilers", f"{APP}:reconcilers")
    assert unknown.returncode == 2
    assert "no reconciler is registered for flow 'taxis'" in unknown.stderr
    bad_time = run("reconcile", "rides", "--since", "yesterday")
    assert bad_time.returncode == 2
    assert "not a time" in bad_time.stderr


def test_cli_reconcile_takes_database_like_every_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/keys.db"
    out = ok(
        "reconcile",
        "receipts",
        "--since",
        "1h",
        "--reconcilers",
        f"{APP}:reconcilers",
        "--database",
        url,
    )
    assert "2 matched" in out
    bad = run("reconcile", "receipts", "--since", "1h", "--database", "oracle://x")
    assert bad.returncode == 2
    assert "unsupported database" in bad.stderr


def test_cli_json_commands_report_errors_as_json_on_stderr(db: Backend) -> None:
    missing = run("keys", "show", "--database", db.url, "nobody", "nothing", "--json")
    assert missing.returncode == 4
    assert missing.stdout == ""
    error = json.loads(missing.stderr)
    assert error["status"] == 4 and error["kind"] == "not_found"
    assert "no key 'nothing' in scope 'nobody'" in error["error"]

    down = run("stats", "--database", "postgresql://postgres@127.0.0.1:1/x", "--json")
    assert down.returncode == 5
    assert json.loads(down.stderr)["kind"] == "unavailable"


def test_cli_migrate_and_evict_print_json(db: Backend) -> None:
    assert json.loads(ok("migrate", "--database", db.url, "--json")) == {"applied": []}
    scope = new_scope()
    finished(db.store, scope, "done")
    out = json.loads(ok("keys", "evict", "--database", db.url, scope, "done", "--json"))
    assert (out["evicted"]["key"], out["evicted"]["state"]) == ("done", "complete")


@pytest.mark.parametrize("args", [["stats"], ["keys", "list"], ["sweep"], ["worker"]])
def test_cli_a_missing_sqlite_file_is_refused_not_created(tmp_path: Path, args: list[str]) -> None:
    path = tmp_path / "typo.db"
    result = run(*args, "--database", f"sqlite:///{path}", timeout=30)
    assert result.returncode == 5, result.stderr
    assert "does not exist" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not path.exists()
