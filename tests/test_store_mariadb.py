"""What the MariaDB store does beyond the conformance suite (issue 31 item 6): the
claim's race on real connections (P1, P6), a worker killed or frozen mid-request
(takeover P5, fencing F1), a racing transaction's claim answered without waiting
(F8), waiting by polling (P10), the CLI on a mariadb:// URL, keys compared byte for
byte, fail-closed errors, and the statements a query becomes (pure)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from idempotence import (
    ClaimRequest,
    ConfigurationError,
    LockLost,
    Outcome,
    StoredResponse,
    StoreUnavailable,
)
from idempotence.database import DatabaseUrl, open_async_store, open_store
from idempotence.stores.mariadb import AsyncMariaDBStore, MariaDBStore, Settings
from idempotence.stores.mariadb._steps import plan, with_selected
from tests.support.mariadb import (
    connect,
    mariadb_url,  # noqa: F401 - the fixture
)

FP = "a" * 64
ROOT = Path(__file__).resolve().parents[1]
CLI = Path(sys.executable).parent / "idempotence"


def request(scope: str, key: str = "k", **kw: Any) -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint=FP, **kw)


@pytest.fixture
def store(mariadb_url: str) -> Iterator[MariaDBStore]:  # noqa: F811
    """A store on this module's database (here, not the conftest's store of any kind)."""
    with MariaDBStore(mariadb_url) as opened:
        yield opened


# -- the claim's race (P1, P6) ------------------------------------------------------------


def test_p6_racing_threads_claim_a_new_key_once(mariadb_url: str, scope: str) -> None:  # noqa: F811
    outcomes: list[Outcome] = []
    start = threading.Barrier(8)
    with MariaDBStore(mariadb_url, max_size=8) as store:

        def claim(key: str) -> None:
            start.wait()
            try:
                outcomes.append(store.claim(request(scope, key)).outcome)
            except Exception as exc:  # what the test reports
                outcomes.append(exc)

        for round_ in range(5):
            outcomes.clear()
            threads = [threading.Thread(target=claim, args=(f"k{round_}",)) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert (
                sorted(str(o) for o in outcomes)
                == [str(Outcome.EXECUTE)] + [str(Outcome.IN_PROGRESS)] * 7
            ), outcomes


def test_p6_racing_tasks_claim_a_new_key_once(mariadb_url: str, scope: str) -> None:  # noqa: F811
    async def race() -> list[Outcome]:
        async with AsyncMariaDBStore(mariadb_url, max_size=8) as store:
            claims = await asyncio.gather(*(store.claim(request(scope)) for _ in range(8)))
            return [claim.outcome for claim in claims]

    outcomes = asyncio.run(race())
    assert sorted(o.value for o in outcomes) == ["execute"] + ["in_progress"] * 7


def test_p6_a_race_lost_to_a_duplicate_key_runs_the_claim_again(
    mariadb_url: str,  # noqa: F811
    scope: str,
) -> None:
    # Under READ COMMITTED (an application's connection may run at it) the claim's
    # NOT EXISTS reads no lock, so both racers insert, and the loser's INSERT fails
    # with a duplicate key once the winner commits: that claim runs again.
    def connection() -> Any:
        raw = connect(mariadb_url)
        with raw.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return raw

    raws = [connection(), connection()]
    stores = [MariaDBStore(raw) for raw in raws]
    try:
        for round_ in range(20):
            start = threading.Barrier(2)
            outcomes: list[Any] = []

            def claim(store: MariaDBStore, key: str, start: Any, outcomes: list[Any]) -> None:
                start.wait()
                try:
                    outcomes.append(store.claim(request(scope, key)).outcome)
                except Exception as exc:  # what the test reports
                    outcomes.append(exc)

            threads = [
                threading.Thread(target=claim, args=(st, f"k{round_}", start, outcomes))
                for st in stores
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert sorted(str(o) for o in outcomes) == [
                str(Outcome.EXECUTE),
                str(Outcome.IN_PROGRESS),
            ], outcomes
    finally:
        for raw in raws:
            raw.close()


# -- F8: a transaction's claim does not wait for another's ---------------------------------


def test_f8_a_racing_transaction_claim_is_answered_from_a_read(
    mariadb_url: str,  # noqa: F811
    scope: str,
) -> None:
    with MariaDBStore(mariadb_url) as store:
        holder = store.transaction(claim=request(scope))
        tx = holder.__enter__()
        try:
            assert tx.claim.outcome is Outcome.EXECUTE
            result: list[Any] = []

            def twin() -> None:
                with MariaDBStore(mariadb_url) as other:
                    began = time.monotonic()
                    with other.transaction(claim=request(scope)) as twin_tx:
                        result.append((twin_tx.claim, time.monotonic() - began))

            thread = threading.Thread(target=twin)
            thread.start()
            thread.join(timeout=20)
            claim, waited = result[0]
            assert claim.outcome is Outcome.IN_PROGRESS and claim.held
            assert waited < 5  # one lock wait of CLAIM_LOCK_WAIT, not the server's 50 s
            store.finish(tx.claim.lease, StoredResponse.of(201, {}, "done"), tx=tx)
        finally:
            holder.__exit__(None, None, None)
        assert store.claim(request(scope)).outcome is Outcome.REPLAY


# -- a worker killed, or frozen, mid-request (P5, F1) ----------------------------------------

WORKER = textwrap.dedent(
    """
    import os, signal, sys
    from datetime import timedelta
    from idempotence import ClaimRequest
    from idempotence.stores.mariadb import MariaDBStore

    url, scope, how = sys.argv[1:]
    store = MariaDBStore(url)
    request = ClaimRequest(scope=scope, key="k", fingerprint="a" * 64,
                           lock_timeout=timedelta(seconds=1))
    lease = store.claim(request).lease
    with store.transaction() as tx:
        tx.execute("INSERT INTO mariadb_effects (scope, what) VALUES (:s, 'worker')", {"s": scope})
        print(lease.token, flush=True)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen: a GC pause, a partition
        store.checkpoint(tx, lease, "charged")
    """
)


def worker(url: str, scope: str, how: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, url, scope, how], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "1"  # it holds the key, mid-phase
    return process


def effects(store: MariaDBStore, scope: str) -> list[str]:
    with store.transaction() as tx:
        rows = tx.execute("SELECT what FROM mariadb_effects WHERE scope = :s", {"s": scope})
    return [row["what"] for row in rows]


@pytest.fixture
def effects_table(mariadb_url: str) -> str:  # noqa: F811
    with MariaDBStore(mariadb_url) as store, store.transaction() as tx:
        tx.execute("CREATE TABLE IF NOT EXISTS mariadb_effects (scope TEXT, what TEXT)")
    return mariadb_url


def test_p5_a_killed_worker_is_taken_over_and_its_phase_is_gone(
    effects_table: str, scope: str
) -> None:
    process = worker(effects_table, scope, "kill")
    process.wait(timeout=10)
    assert process.returncode == -signal.SIGKILL
    with MariaDBStore(effects_table) as store:
        assert store.claim(request(scope)).outcome is Outcome.IN_PROGRESS  # its lock holds
        deadline = time.monotonic() + 10
        while (claim := store.claim(request(scope))).outcome is not Outcome.EXECUTE:
            assert time.monotonic() < deadline, claim
            time.sleep(0.1)
        assert claim.lease is not None and claim.lease.token == 2
        assert effects(store, scope) == []  # the dead connection's transaction rolled back


def test_f1_a_frozen_worker_resumed_after_a_takeover_cannot_commit(
    effects_table: str, scope: str
) -> None:
    process = worker(effects_table, scope, "freeze")
    try:
        with MariaDBStore(effects_table) as store:
            # Its open transaction holds no lock on the key row (the claim committed
            # alone), so after the lock timeout a retry takes the key over.
            deadline = time.monotonic() + 10
            while (claim := store.claim(request(scope))).outcome is not Outcome.EXECUTE:
                assert time.monotonic() < deadline, claim
                time.sleep(0.1)
            assert claim.lease is not None and claim.lease.token == 2
            process.send_signal(signal.SIGCONT)
            process.wait(timeout=20)
            assert process.returncode == 1  # LockLost out of its checkpoint
            assert effects(store, scope) == []  # its phase rolled back with its writes
            store.finish(claim.lease, StoredResponse.of(201, {}, "taker"))
            replay = store.claim(request(scope))
            assert replay.outcome is Outcome.REPLAY and replay.record.lock_token == 2
    finally:
        if process.poll() is None:
            process.kill()


def test_f1_a_fenced_write_that_changes_nothing_still_proves_the_lease(
    store: MariaDBStore, scope: str
) -> None:
    # The second release sets locked_at to the NULL it holds: the server changes no
    # row, but the row matched the lease, so it is no LockLost (found rows, not
    # changed rows), as on PostgreSQL.
    lease = store.claim(request(scope)).lease
    assert lease is not None
    store.release(lease)
    store.release(lease)
    assert store.get(scope, "k").locked_at is None  # type: ignore[union-attr]


# -- P10: a duplicate waits by polling --------------------------------------------------------


def test_p10_wait_for_settle_polls_and_returns_within_its_bound(
    store: MariaDBStore, scope: str
) -> None:
    lease = store.claim(request(scope)).lease
    assert lease is not None
    began = time.monotonic()
    store.wait_for_settle(scope, "k", 0.2)
    assert 0.15 < time.monotonic() - began < 2
    store.finish(lease, StoredResponse.of(200, {}, "x"))
    assert store.claim(request(scope)).outcome is Outcome.REPLAY


# -- keys and scopes compare byte for byte ------------------------------------------------------


def test_keys_are_case_and_trailing_space_sensitive(store: MariaDBStore, scope: str) -> None:
    ids = {store.claim(request(scope, key)).lease.id for key in ("k", "K", "k ", "é")}  # type: ignore[union-attr]
    assert len(ids) == 4


def test_a_scope_too_long_for_its_column_is_refused_not_cut(store: MariaDBStore) -> None:
    # Cut to 255 characters, two scopes would share keys: strict mode refuses instead.
    with pytest.raises(Exception, match="too long"):
        store.claim(request("s" * 300))


# -- fail closed, and clear errors ---------------------------------------------------------------


def test_p11_an_unreachable_server_is_unavailable_fast() -> None:
    with MariaDBStore("mariadb://root@127.0.0.1:1/nothing", connect_timeout=1) as store:
        began = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.claim(request("s"))
        assert time.monotonic() - began < 5


def test_a_zombie_lease_is_refused_by_every_fenced_write(store: MariaDBStore, scope: str) -> None:
    lease = store.claim(request(scope, lock_timeout=timedelta(milliseconds=1))).lease
    time.sleep(0.01)
    assert store.claim(request(scope)).lease.token == 2  # type: ignore[union-attr]
    for fenced in (store.release, store.heartbeat, store.forget):
        with pytest.raises(LockLost):
            fenced(lease)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mariadb://root@db:3306", "names one database"),
        ("mariadb://root@db:99999/app", "invalid port"),
        ("mariadb://root@db/app?ssl=1", "unknown option"),
    ],
)
def test_a_bad_url_says_what_to_fix(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        MariaDBStore(url)


def test_urls_open_the_store_through_the_one_factory(mariadb_url: str) -> None:  # noqa: F811
    assert DatabaseUrl.parse("mysql://app@db/app") == DatabaseUrl("mariadb", "mariadb://app@db/app")
    assert Settings.from_url("mysql://a:p%40ss@db:3307/app").password == "p@ss"
    with open_store(mariadb_url) as store:
        assert isinstance(store, MariaDBStore)
    store_async = open_async_store(mariadb_url.replace("mariadb://", "mysql://"))
    assert isinstance(store_async, AsyncMariaDBStore)
    asyncio.run(store_async.close())


# -- the CLI on a mariadb:// URL ---------------------------------------------------------------


@pytest.mark.slow  # processes of their own (the CLI, a server, a benchmark)
def test_cli_migrates_lists_shows_and_counts(scope: str) -> None:
    from tests.support.mariadb import database

    def ok(*args: str) -> str:
        result = subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    with database(prefix="idempotence_cli", migrate=False) as url:
        assert "0001_initial" in ok("migrate", "--database", url)
        assert "up to date" in ok("migrate", "--database", url)
        with MariaDBStore(url) as store:
            lease = store.claim(request(scope)).lease
            assert lease is not None
            store.finish(lease, StoredResponse.of(201, {}, '{"ok": true}'))
            store.claim(request(scope, "pending"))
        listed = json.loads(ok("keys", "list", "--database", url, "--json"))
        assert {(row["key"], row["state"]) for row in listed} == {
            ("k", "complete"),
            ("pending", "processing"),
        }
        shown = json.loads(ok("keys", "show", "--database", url, scope, "k", "--json"))
        assert shown["response"]["status"] == 201
        stats = ok("stats", "--database", url)
        assert "complete" in stats and "processing" in stats


# -- the statements a query becomes (no database) -------------------------------------------------


def test_an_update_returning_becomes_the_update_then_a_read_of_its_row() -> None:
    steps = plan(
        "UPDATE idempotency_keys SET a = 1\n"
        "WHERE scope = %(scope)s AND id = %(id)s AND b = 2\nRETURNING id, a"
    )
    assert [(step.sql, step.echo) for step in steps] == [
        (
            "UPDATE idempotency_keys SET a = 1\nWHERE scope = %(scope)s AND id = %(id)s AND b = 2",
            None,
        ),
        ("SELECT id, a FROM idempotency_keys WHERE scope = %(scope)s AND id = %(id)s", None),
    ]


def test_a_returned_column_the_where_fixes_is_its_parameter_with_no_read() -> None:
    (step,) = plan(
        "UPDATE k SET x = 1 WHERE scope = %(scope)s AND id = %(id)s AND lock_token = %(token)s"
        " AND finished_at IS NULL RETURNING id, lock_token"
    )
    assert step.echo == (("id", "id"), ("lock_token", "token"))
    assert "RETURNING" not in step.sql


def test_an_update_returning_that_does_not_name_its_row_is_refused() -> None:
    with pytest.raises(ValueError, match="name its one row"):
        plan("UPDATE t SET a = 1 WHERE b = 2 RETURNING a")


def test_a_script_splits_at_semicolons_ending_a_line_and_lists_ids() -> None:
    steps = plan("SELECT id FROM t FOR UPDATE;\nDELETE FROM t WHERE id IN %(selected)s")
    assert [step.sql for step in steps] == [
        "SELECT id FROM t FOR UPDATE",
        "DELETE FROM t WHERE id IN %(selected)s",
    ]
    assert with_selected(steps[1].sql, [3, 1]) == "DELETE FROM t WHERE id IN (3, 1)"


def test_every_query_of_the_dialect_plans() -> None:
    from idempotence import _queries

    for name, sql in _queries.load("mariadb").items():
        assert plan(sql), name


def test_the_mariadb_store_is_built_on_the_public_store_interface() -> None:
    """Issue 31's proof: the store imports idempotence.stores.sql (and its own modules),
    never a private module of another store or of the shared SQL machinery."""
    from tests.unit.test_imports import import_graph, private_store_imports

    found = private_store_imports(import_graph(), "idempotence.stores.mariadb")
    outside = {
        name: {m for m in modules if not m.startswith("idempotence.stores.mariadb.")}
        for name, modules in found.items()
    }
    assert {name: modules for name, modules in outside.items() if modules} == {}


def test_schema_sql_is_the_sum_of_the_migrations() -> None:
    """A database built from schema.sql and one built by the migrations are the same
    to the catalog: tables, columns (types, defaults, collations), indexes, checks,
    views."""
    from idempotence import _queries
    from idempotence.stores.mariadb import MariaDBDialect
    from tests.support.mariadb import database

    def snapshot(url: str) -> dict[str, Any]:
        where = Settings.from_url(url)
        conn = connect(url)
        queries = {
            "tables": "SELECT table_name, engine, table_collation FROM information_schema.tables"
            " WHERE table_schema = %s AND table_name <> 'idempotence_migrations'",
            "columns": "SELECT table_name, column_name, ordinal_position, column_default,"
            " is_nullable, column_type, collation_name FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name <> 'idempotence_migrations'",
            "indexes": "SELECT table_name, index_name, seq_in_index, column_name, non_unique"
            " FROM information_schema.statistics WHERE table_schema = %s"
            " AND table_name <> 'idempotence_migrations'",
            "checks": "SELECT table_name, constraint_name, check_clause"
            " FROM information_schema.check_constraints WHERE constraint_schema = %s",
            # A view's text names its database: left out, so that the two compare.
            "views": "SELECT table_name, replace(view_definition, table_schema, '') AS definition,"
            " algorithm FROM information_schema.views WHERE table_schema = %s",
        }
        try:
            with conn.cursor() as cur:
                found = {}
                for name, sql in queries.items():
                    cur.execute(sql, (where.database,))
                    found[name] = sorted(cur.fetchall(), key=repr)
                return found
        finally:
            conn.close()

    with (
        database(prefix="idempotence_schema") as migrated,
        database(prefix="idempotence_schema", migrate=False) as built,
    ):
        conn = connect(built)
        try:
            with conn.cursor() as cur:
                for statement in MariaDBDialect().script_statements(_queries.schema("mariadb")):
                    cur.execute(statement)
        finally:
            conn.close()
        assert snapshot(built) == snapshot(migrated)
        assert snapshot(built)["tables"]  # the comparison saw the tables
        assert snapshot(built)["views"]  # and the view


@pytest.mark.slow  # processes of their own (the CLI, a server, a benchmark)
def test_without_a_server_the_tests_start_a_throwaway_one_and_stop_it() -> None:
    """tests/support/mariadb.py's last resort, as on a machine whose MariaDB is down:
    mariadb-install-db and mariadbd in a temporary directory, gone when the process
    that started them exits."""
    script = textwrap.dedent(
        """
        import os
        os.environ["IDEMPOTENCE_TEST_MARIADB"] = "throwaway"
        from tests.support.mariadb import database, server_url
        from idempotence import ClaimRequest, Outcome
        from idempotence.stores.mariadb import MariaDBStore
        print(server_url(), flush=True)
        with database() as url, MariaDBStore(url) as store:
            claim = store.claim(ClaimRequest(scope="s", key="k", fingerprint="f" * 64))
            print(claim.outcome is Outcome.EXECUTE, flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    url, executed = done.stdout.split()
    assert url.startswith("mariadb://root@127.0.0.1:") and not url.endswith(":3306")
    assert executed == "True"
    from tests.support.mariadb import _answers

    assert _answers(url) is not None  # stopped at exit


@pytest.mark.slow  # processes of their own (the CLI, a server, a benchmark)
def test_the_driver_benchmark_measures_the_store_s_two_drivers() -> None:
    from tests.support.mariadb import server_url

    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "mariadb_drivers.py"), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "IDEMPOTENCE_TEST_MARIADB": server_url()},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout)["rows"]
    measured = {(row["driver"], row["workers"]) for row in rows}
    assert {("pymysql", 1), ("pymysql", 8), ("aiomysql", 1), ("aiomysql", 8)} <= measured
    assert all(row["calls_per_s"] > 0 and row["client_us_per_call"] > 0 for row in rows)


def test_a_database_nobody_migrated_says_to_migrate() -> None:
    from idempotence import SchemaMissing, StoreError
    from tests.support.mariadb import database

    with database(prefix="idempotence_empty", migrate=False) as url, MariaDBStore(url) as store:
        with pytest.raises(SchemaMissing, match="idempotence migrate"):
            store.claim(request("s"))
        with store.transaction() as tx, pytest.raises(StoreError, match="doesn't exist") as raised:
            # The application's own missing table is its error, not the key store's.
            tx.execute("SELECT * FROM no_such_table")
        assert not isinstance(raised.value, SchemaMissing)


def test_a_closed_store_is_unavailable(mariadb_url: str) -> None:  # noqa: F811
    store = MariaDBStore(mariadb_url)
    assert store.claim(request("closed")).outcome is Outcome.EXECUTE
    store.close()
    with pytest.raises(StoreUnavailable):
        store.claim(request("closed", "k2"))
