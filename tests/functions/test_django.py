"""``@idempotent`` on DjangoStore (PostgreSQL and SQLite through Django's connection),
run in a child process because Django's settings are process-wide: racing callers run
the body once; a transactional body's ORM-connection writes roll back with the key
and commit once with it (F3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_django_store(database: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if database == "sqlite":
        url = str(tmp_path / "django.sqlite3")
    else:
        url = request.getfixturevalue("empty_pg_url")
    spec = {"database": url, "table": f"fn_django_{uuid.uuid4().hex[:10]}"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    child = subprocess.run(
        [sys.executable, "-m", "tests.functions.django_child", json.dumps(spec)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    stored = json.dumps({"order": "o-1"})
    assert report["outcomes"] == sorted([stored] * 2 + ["in_progress"] * 4)
    assert report["runs"] == {"plain": 1, "tx": 2}  # the rolled-back run, then one
    assert report["rolled_back"] is True
    assert report["results"] == [1, 1]
    assert report["rows"] == ["o-2"]
