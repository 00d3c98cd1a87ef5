"""What the PostgreSQL store says of its replication (DESIGN 13).

stores/postgres/_replication.py: pure, no server.
"""

from __future__ import annotations

import pytest

from idempotence.stores.postgres._replication import Replication, describe, report


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (
            {"names": "standby1", "commit_level": "on", "standbys": 1, "synchronous": 1},
            Replication.SYNCHRONOUS,
        ),
        (
            {
                "names": "ANY 1 (a, b)",
                "commit_level": "remote_apply",
                "standbys": 2,
                "synchronous": 2,
            },
            Replication.SYNCHRONOUS,
        ),
        (
            {"names": "standby1", "commit_level": "on", "standbys": 0, "synchronous": 0},
            Replication.WAITING,
        ),
        (
            {"names": "", "commit_level": "on", "standbys": 1, "synchronous": 0},
            Replication.ASYNCHRONOUS,
        ),
        (
            {"names": "standby1", "commit_level": "local", "standbys": 1, "synchronous": 1},
            Replication.ASYNCHRONOUS,
        ),
        ({"names": "", "commit_level": "on", "standbys": 0, "synchronous": 0}, Replication.NONE),
        (
            {"names": "s", "commit_level": "on", "standbys": 1, "synchronous": 0, "hidden": 1},
            Replication.UNKNOWN,
        ),
    ],
)
def test_the_replication_is_read_from_the_settings_and_the_standbys(
    row: dict[str, object], expected: Replication
) -> None:
    assert describe(row).replication is expected


def test_only_a_synchronous_standby_passes_when_one_is_required() -> None:
    sync = describe({"names": "s", "commit_level": "on", "standbys": 1, "synchronous": 1})
    assert report(sync, required=True) is None
    for row in (
        {"names": "", "commit_level": "on", "standbys": 1, "synchronous": 0},
        {"names": "s", "commit_level": "on", "standbys": 0, "synchronous": 0},
        {"names": "", "commit_level": "on", "standbys": 0, "synchronous": 0},
    ):
        refused = report(describe(row), required=True)
        assert refused is not None and "require_synchronous_standby=True" in refused
        assert report(describe(row), required=False) is None
