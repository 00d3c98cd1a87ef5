"""Flow phases on the SQLAlchemy store: each phase's ORM writes commit with its
checkpoint, or not at all. The crash harness (F4) kills the flow at every boundary
(before and after each phase's commit, around the foreign call and inside the
provider's commit) and proves exactly-once on PostgreSQL and SQLite, sync and async."""

from __future__ import annotations

from pathlib import Path

import pytest

from idempotence.testing import crash_test
from tests.sqla.conftest import Database
from tests.sqla.flow_target import prepare

#: The slow tier: flows on the SQLAlchemy stores under SIGKILL (about a minute each).
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_r2_f4_orm_phases_survive_a_crash_at_every_boundary(
    database: Database, tmp_path: Path, flavour: str
) -> None:
    prepare(database.sync_url)
    config = {
        "url": database.sync_url,
        "async_url": database.async_url,
        "provider": str(tmp_path / "provider.sqlite3"),
        "lock_timeout": 0.4,
    }
    # Async: the boundaries of the database transactions only (the foreign call's are
    # the engine's, tested sync), to keep the run short.
    select = None if flavour == "sync" else lambda point: point.event.startswith(("phase", "sql"))
    report = crash_test(
        "tests.sqla.flow_target:target",
        config,
        flavour=flavour,  # type: ignore[arg-type]
        select=select,
    )
    killed = [result for result in report.results if result.killed]
    assert killed, report
    points = {result.point.event for result in killed}
    assert {"phase:started:before_commit", "sql:checkpoint:before_commit"} <= points, points
