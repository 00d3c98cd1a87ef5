"""F1 with real processes: a worker frozen (SIGSTOP) past its lock timeout wakes up
after another worker took its key over and finished it. Its commit is refused by the
fence: its run ends LOST, its writes roll back, and the stored response stays the
other worker's."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from idempotence import SqliteStore, StoreError
from idempotence.flows import ResultKind
from idempotence.testing import FakeProvider, KillPoint, Worker, load_target, spawn_worker

# The slow tier: frozen workers that wait out a lock's lapse.
pytestmark = pytest.mark.slow

EXAMPLE = "idempotence.testing.example:crash_target"
LOCK_TIMEOUT = 0.4


def config(database_url: str, tmp_path: Path) -> dict[str, Any]:
    return {
        "database": database_url,
        "provider": str(tmp_path / "provider.sqlite3"),
        "lock_timeout": LOCK_TIMEOUT,
    }


def frozen_worker(cfg: dict[str, Any], tmp_path: Path, scope: str, event: str) -> Worker:
    worker = spawn_worker(
        EXAMPLE, cfg, scope=scope, key="k", workdir=tmp_path / "a", stop_at=KillPoint(event)
    )
    worker.wait_stopped()
    time.sleep(LOCK_TIMEOUT + 0.2)  # A stays frozen past its lock timeout
    return worker


def rows(store: Any, table: str, scope: str, *, postgres: bool) -> list[dict[str, Any]]:
    with store.transaction() as tx:
        return list(
            tx.execute(f"SELECT * FROM {table} WHERE scope = :scope ORDER BY id", {"scope": scope})
        )


def test_f1_a_zombie_inside_a_phase_cannot_commit_after_a_takeover_on_postgres(
    pg_flows_url: str, tmp_path: Path, scope: str
) -> None:
    cfg = config(pg_flows_url, tmp_path)
    # A stops after its ride and audit row are written in its open transaction, just
    # before its checkpoint.
    a = frozen_worker(cfg, tmp_path, scope, "phase:started:before_commit")
    target = load_target(EXAMPLE, cfg)
    store = target.open_store()
    try:
        b = target.flow.run(store, target.request(scope, "k"))
        assert b.kind is ResultKind.EXECUTED and b.response is not None
    finally:
        a.resume()
    try:
        a.wait(30)
        a_result = a.result()
        assert a_result is not None, a.stderr()
        assert (a_result.kind, a_result.response) == (ResultKind.LOST, None)
        assert a_result.error is not None and "lock token 1" in a_result.error

        rides = rows(store, "rides", scope, postgres=True)
        assert len(rides) == 1  # B's; A's rolled back
        assert json.loads(b.response.body)["id"] == rides[0]["id"]
        assert [r["action"] for r in rows(store, "ride_audit", scope, postgres=True)] == [
            "ride_created",
            "charge_charged",
        ]
        replay = target.flow.run(store, target.request(scope, "k"))
        assert (replay.kind, replay.response) == (ResultKind.REPLAYED, b.response)
        assert len(FakeProvider(cfg["provider"]).charges(reference=f"{scope}/k")) == 1
    finally:
        store.close()


def test_f1_on_sqlite_a_frozen_phase_blocks_the_takeover_instead_of_racing_it(
    sqlite_flows_path: str, tmp_path: Path, scope: str
) -> None:
    # SQLite has one writer: a worker frozen inside its phase holds the write lock, so
    # nobody can take its key over. The other worker fails (and answers 503); it never
    # runs the flow a second time.
    cfg = config("sqlite:///" + sqlite_flows_path, tmp_path)
    a = frozen_worker(cfg, tmp_path, scope, "phase:started:before_commit")
    target = load_target(EXAMPLE, cfg)
    impatient = SqliteStore(sqlite_flows_path, busy_timeout=0.05)
    try:
        with pytest.raises(StoreError):
            target.flow.run(impatient, target.request(scope, "k"))
    finally:
        a.resume()
        impatient.close()
    a.wait(30)
    a_result = a.result()
    assert a_result is not None and a_result.kind is ResultKind.EXECUTED, a.stderr()
    with SqliteStore(sqlite_flows_path) as store:
        assert len(rows(store, "rides", scope, postgres=False)) == 1


def test_f1_a_zombie_inside_a_foreign_call_cannot_record_after_a_takeover(
    database_url: str, backend: str, tmp_path: Path, scope: str
) -> None:
    cfg = config(database_url, tmp_path)
    # A stops after the provider charged it, before it records the charge.
    a = frozen_worker(cfg, tmp_path, scope, "call:charge:after")
    target = load_target(EXAMPLE, cfg)
    store = target.open_store()
    try:
        b = target.flow.run(store, target.request(scope, "k"))
        assert b.kind is ResultKind.EXECUTED and b.response is not None
    finally:
        a.resume()
    try:
        a.wait(30)
        a_result = a.result()
        assert a_result is not None and a_result.kind is ResultKind.LOST, a.stderr()
        postgres = backend == "postgres"
        assert len(rows(store, "rides", scope, postgres=postgres)) == 1
        assert len(rows(store, "ride_audit", scope, postgres=postgres)) == 2
        # B charged with the same derived key: the provider handed back A's charge.
        provider = FakeProvider(cfg["provider"])
        charges = provider.charges(reference=f"{scope}/k")
        assert len(charges) == 1 and provider.received(reference=f"{scope}/k") == 2
        assert json.loads(b.response.body)["charge_id"] == charges[0].id
        replay = target.flow.run(store, target.request(scope, "k"))
        assert (replay.kind, replay.response) == (ResultKind.REPLAYED, b.response)
    finally:
        store.close()
