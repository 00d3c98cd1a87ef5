"""The engine's handler step on the MariaDB store (F6, R5, F3, P10, F2): the tests of
tests/flows/test_handler_step.py, collected here again with ``store`` a MariaDB store
on a fresh database of the test's own (issue 31 item 6)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.flows.test_handler_step import *  # noqa: F403 - the same tests, collected here
from tests.support.mariadb import database

# Those that open SQLite stores of their own, or need no store, stay in their module.
for _name in (
    "test_f2_an_async_handler_keeps_its_key_and_its_beating_task_ends_with_it",
    "test_f2_a_failed_beat_is_logged_and_the_next_one_keeps_the_key",
    "test_a_fixed_response_refuses_stored_server_errors",
    "test_f6_the_handler_step_is_a_flows_only_step",
    "test_f2_a_heartbeat_must_be_positive",
):
    del globals()[_name]


@pytest.fixture
def store() -> Iterator[Any]:
    from idempotence.stores.mariadb import MariaDBStore

    with database(prefix="idempotence_flows") as url, MariaDBStore(url) as store:
        with store.transaction() as tx:
            tx.execute("CREATE TABLE IF NOT EXISTS handler_notes (note TEXT)")
        yield store
