"""A guarded call SIGKILLed mid-run (DESIGN 12, P4, P5, F2, F3).

* handler mode, on every kind of store: the dead call's key stays locked for the lock
  timeout (a retry is refused, the body not run), then a retry takes it over (token
  2) and the effect happens once;
* ``transactional=True`` on a SQL store: the body's write dies with the claim's
  transaction, so a retry runs at once, as the first claim, and its write is the only
  one (no crash window, F3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from idempotence import CallInProgress
from tests.functions.crash_child import build, open_store

# The slow tier: each test kills a process at every boundary and recovers.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _spec(
    request: pytest.FixtureRequest, backend: str, mode: str, tmp_path: Path
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "backend": backend,
        "mode": mode,
        "key": f"crash-{uuid.uuid4().hex[:10]}",
        "table": f"fn_crash_{uuid.uuid4().hex[:10]}",
        "effects": str(tmp_path / "effects.txt"),
    }
    if backend == "sqlite":
        spec["url"] = request.getfixturevalue("sqlite_path")
    elif backend == "postgres":
        spec["url"] = request.getfixturevalue("pg_url")
    else:
        spec["url"] = request.getfixturevalue("redis_url")
        spec["prefix"] = request.getfixturevalue("redis_prefix")
    return spec


@pytest.mark.parametrize(
    ("backend", "mode"),
    [
        ("sqlite", "handler"),
        ("postgres", "handler"),
        ("redis", "handler"),
        ("sqlite", "transactional"),
        ("postgres", "transactional"),
    ],
)
def test_a_body_killed_mid_run_never_has_two_effects(
    request: pytest.FixtureRequest, backend: str, mode: str, tmp_path: Path
) -> None:
    spec = _spec(request, backend, mode, tmp_path)
    key = spec["key"]
    store = open_store(spec)
    try:
        if mode == "transactional":
            with store.transaction() as tx:
                tx.execute(f"CREATE TABLE {spec['table']} (ref VARCHAR(100) NOT NULL)")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        child = subprocess.run(
            [sys.executable, "-m", "tests.functions.crash_child", json.dumps(spec)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.returncode == -9, child.stderr  # SIGKILLed in the body
        guarded = build(store, spec, kill=False)
        if mode == "transactional":
            assert guarded(key, 100) == 100  # nothing of the dead call is left
            with store.transaction() as tx:
                rows = tx.execute(f"SELECT ref FROM {spec['table']}")
            assert [_first(row) for row in rows] == [key]
            assert store.get("crash-place", key).lock_token == 1
            return
        # The dead call's lock still stands: refused, the body not run.
        with pytest.raises(CallInProgress) as refused:
            guarded(key, 100)
        assert 0 < refused.value.retry_after <= 2.0
        deadline = time.monotonic() + 20
        while True:
            try:
                assert guarded(key, 100) == 100
                break
            except CallInProgress as exc:
                assert time.monotonic() < deadline, "the dead call's key was never taken over"
                time.sleep(min(max(exc.retry_after, 0.05), 1.0))
        assert guarded(key, 100) == 100  # finished: replayed
        lines = Path(spec["effects"]).read_text().splitlines()
        assert lines == [f"entered {key}", f"entered {key}", f"effect {key}"]
        record = store.get("crash-place", key)
        assert record.finished and record.lock_token == 2  # one takeover (P5)
    finally:
        store.close()


def _first(row: Any) -> Any:
    return next(iter(row.values())) if isinstance(row, dict) else row[0]
