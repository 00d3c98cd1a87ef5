"""DjangoStore passes the store conformance suite (idempotence.testing.conformance) on
PostgreSQL and SQLite. The suite runs in a pytest process of its own
(tests/django_orm/conformance.py), since Django's settings are process-wide; this test
fails with that run's output unless every test of it passed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.postgres import settings_env

ROOT = Path(__file__).resolve().parents[2]
SUITE = Path(__file__).with_name("conformance.py")


@pytest.mark.parametrize("engine", [pytest.param("postgresql", marks=pytest.mark.slow), "sqlite"])
def test_django_store_passes_the_conformance_suite(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    if engine == "postgresql":
        env |= settings_env("CONFORMANCE", request.getfixturevalue("empty_pg_url"))
    else:
        env["CONFORMANCE_DB_NAME"] = str(tmp_path / "keys.sqlite3")
    env["CONFORMANCE_DB_ENGINE"] = engine
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(SUITE), "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    # Every test ran and passed: none skipped, none deselected.
    summary = re.search(r"^(\d+) passed in ", output, re.MULTILINE)
    assert summary is not None, output
    assert int(summary.group(1)) >= 60, output
