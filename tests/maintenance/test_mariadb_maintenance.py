"""The background services and the operator's commands on the MariaDB store (DESIGN
7, F5; issue 31 item 6): the sweeper, reaper, completer, enqueuer and job runner
suites and the admin functions, sync and async, collected here again with ``db`` a
fresh MariaDB database of the test's own. The three that test PostgreSQL itself
(``pg_db``: NOTIFY, LOCK TABLE, its statement timeout) are not collected here."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest

from idempotence.errors import TransientError
from idempotence.maintenance import Enqueuer, EnqueuerConfig, RunnerSink
from idempotence.states import StagedJob
from idempotence.stores import Store, Transaction
from tests.maintenance.support import Backend
from tests.maintenance.test_admin import *  # noqa: F403 - the same tests, collected here
from tests.maintenance.test_completer import *  # noqa: F403
from tests.maintenance.test_enqueuer import *  # noqa: F403
from tests.maintenance.test_enqueuer import stage
from tests.maintenance.test_reaper import *  # noqa: F403
from tests.maintenance.test_sweeper import *  # noqa: F403
from tests.support.mariadb import database
from tests.support.polling import eventually
from tests.support.sql_dialects import mariadb_connection

#: The slow tier: the services on MariaDB (the fast tier runs them on SQLite).
pytestmark = pytest.mark.slow


# -- an InnoDB deadlock aborts a batch: it runs again ---------------------------------


class _Rival:
    """A transaction on a connection of its own that holds row 1 of ``rows``, weighs
    more than an enqueuer's batch (it has inserted rows: InnoDB rolls back the lighter
    transaction of a deadlock), and, once told, waits for row 2."""

    def __init__(self, db: Backend) -> None:
        self._conn = mariadb_connection(db.url, autocommit=False)
        with self._conn.cursor() as cur:
            cur.executemany("INSERT INTO ballast (n) VALUES (%s)", [(n,) for n in range(200)])
            cur.execute("SELECT id FROM rows_to_lock WHERE id = 1 FOR UPDATE")
        self._thread: threading.Thread | None = None

    def wait_for_row_2(self) -> None:
        def wait() -> None:
            with self._conn.cursor() as cur:
                cur.execute("SELECT id FROM rows_to_lock WHERE id = 2 FOR UPDATE")

        self._thread = threading.Thread(target=wait)
        self._thread.start()

    def end(self) -> None:
        if self._thread is not None:
            self._thread.join(30)
        self._conn.rollback()
        self._conn.close()


class _DeadlockingSink:
    """The built-in runner's delivery, but its first batch deadlocks for real: it locks
    row 2, the rival waits for it, and the batch asks for the rival's row 1."""

    def __init__(self, db: Backend, rival: _Rival) -> None:
        self._db, self._rival = db, rival
        self.batches = self.deadlocks = 0

    def deliver(self, store: Store, tx: Transaction, jobs: Sequence[StagedJob]) -> list[str]:
        self.batches += 1
        if self.deadlocks == 0:
            tx.execute("SELECT id FROM rows_to_lock WHERE id = 2 FOR UPDATE")
            self._rival.wait_for_row_2()
            eventually(self._rival_waits, "the rival waits for row 2")
            try:
                tx.execute("SELECT id FROM rows_to_lock WHERE id = 1 FOR UPDATE")
            except TransientError:
                self.deadlocks += 1
                raise
        return RunnerSink().deliver(store, tx, jobs)

    def _rival_waits(self) -> bool:
        waiting = (
            "SELECT count(*) AS n FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
        )
        return self._db.execute(waiting)[0]["n"] > 0


def test_b4_a_batch_aborted_by_a_deadlock_runs_again(db: Backend) -> None:
    """Error 1213 rolls the whole batch back (nothing was delivered): the enqueuer runs
    it again in the same pass instead of failing the pass."""
    db.execute("CREATE TABLE rows_to_lock (id INT PRIMARY KEY)")
    db.execute("INSERT INTO rows_to_lock (id) VALUES (1), (2)")
    db.execute("CREATE TABLE ballast (n INT)")
    keys = stage(db.store, 5)
    rival = _Rival(db)
    sink = _DeadlockingSink(db, rival)
    config = EnqueuerConfig(batch_size=10, batch_pause=0.0)
    try:
        result = Enqueuer(db.open(), config, sink=sink).run_once()
    finally:
        rival.end()
    assert sink.deadlocks == 1, "InnoDB chose the batch as the deadlock's victim"
    assert sink.batches == 2
    assert sorted(result.delivered) == sorted(keys)
    assert result.duplicates == 0
    assert db.count("idempotence_jobs") == 5
    assert db.count("idempotence_staged_jobs") == 0


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
