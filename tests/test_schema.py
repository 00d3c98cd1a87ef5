"""The schema (DESIGN 3) and the migrations that build it.

``schema.sql`` is the whole current schema, for reading; the migrations are what
``idempotence migrate`` runs. A database built from one must be indistinguishable from
a database built from the other, on both backends: the catalogs are compared, not the
files. Migrating is idempotent, serialised across processes, and a store on a database
nobody migrated says what to do.
"""

from __future__ import annotations

import re
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from idempotence import ClaimRequest, SchemaMissing, SqliteStore, StoredResponse, _queries
from idempotence.stores.postgres import PostgresStore
from tests.support.postgres import ProvidedServer, create_database, drop_database

MIGRATIONS_TABLE = "idempotence_migrations"
REQUEST = ClaimRequest(scope="acct_1", key="k1", fingerprint="f" * 64)


def versions(dialect: str) -> list[str]:
    return [version for version, _ in _queries.migrations(dialect)]


# -- PostgreSQL --------------------------------------------------------------------------


def pg_snapshot(url: str) -> dict[str, Any]:
    """Every table of the current schema but the migrations table, as the catalog
    describes it: columns in order, constraints, indexes, triggers and the identity
    sequences; plus the schema's functions."""
    with psycopg.connect(url, autocommit=True) as conn:

        def rows(query: str, *params: Any) -> list[tuple[Any, ...]]:
            return conn.execute(query, params).fetchall()

        tables = [
            name
            for (name,) in rows(
                "SELECT c.relname FROM pg_class c"
                " WHERE c.relnamespace = current_schema()::regnamespace"
                " AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.relname <> %s"
                " ORDER BY c.relname",
                MIGRATIONS_TABLE,
            )
        ]
        snapshot: dict[str, Any] = {}
        for table in tables:
            oid = rows("SELECT %s::regclass::oid", table)[0][0]
            snapshot[table] = {
                "kind": rows("SELECT relkind FROM pg_class WHERE oid = %s", oid),
                "columns": rows(
                    "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,"
                    " pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,"
                    " col_description(a.attrelid, a.attnum)"
                    " FROM pg_attribute a LEFT JOIN pg_attrdef d"
                    " ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
                    " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped"
                    " ORDER BY a.attnum",
                    oid,
                ),
                "constraints": rows(
                    "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint"
                    " WHERE conrelid = %s ORDER BY conname",
                    oid,
                ),
                "indexes": [
                    (name, _unqualified(definition))
                    for name, definition in rows(
                        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
                        " JOIN pg_class c ON c.oid = i.indexrelid"
                        " WHERE i.indrelid = %s ORDER BY c.relname",
                        oid,
                    )
                ],
                "triggers": [
                    (name, _unqualified(definition))
                    for name, definition in rows(
                        "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger"
                        " WHERE tgrelid = %s AND NOT tgisinternal ORDER BY tgname",
                        oid,
                    )
                ],
                "sequences": rows(
                    "SELECT a.attname, s.seqtypid::regtype::text, s.seqstart, s.seqincrement,"
                    " s.seqmin, s.seqmax, s.seqcache, s.seqcycle"
                    " FROM pg_attribute a"
                    " JOIN pg_sequence s ON s.seqrelid"
                    " = pg_get_serial_sequence(%s, a.attname)::regclass"
                    " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped"
                    " ORDER BY a.attname",
                    table,
                    oid,
                ),
                "comment": rows("SELECT obj_description(%s, 'pg_class')", oid),
            }
        snapshot["functions"] = [
            _unqualified(definition)
            for (definition,) in rows(
                "SELECT pg_get_functiondef(p.oid) FROM pg_proc p"
                " WHERE p.pronamespace = current_schema()::regnamespace ORDER BY p.proname"
            )
        ]
        return snapshot


def _unqualified(definition: str) -> str:
    # The catalog qualifies names with their schema; only the shape matters here.
    return re.sub(r"\bpublic\.", "", definition)


@pytest.fixture
def two_pg_databases(pg_server: ProvidedServer) -> Any:
    urls = [
        create_database(pg_server.url, prefix="idempotence_schema"),
        create_database(pg_server.url, prefix="idempotence_migrated"),
    ]
    try:
        yield urls
    finally:
        for url in urls:
            drop_database(pg_server.url, url)


def test_d3_postgres_schema_equals_the_sum_of_migrations(two_pg_databases: list[str]) -> None:
    from_schema, migrated = two_pg_databases
    with psycopg.connect(from_schema, autocommit=True) as conn:
        conn.execute(_queries.schema("postgres"))
    with PostgresStore(migrated) as store:
        assert store.migrate() == versions("postgres")

    expected = pg_snapshot(from_schema)
    assert {"idempotency_keys", "functions"} <= set(expected)
    assert "scope" in [column[0] for column in expected["idempotency_keys"]["columns"]]
    assert pg_snapshot(migrated) == expected


def test_migrate_postgres_is_idempotent_and_records_versions(empty_pg_url: str) -> None:
    with PostgresStore(empty_pg_url) as store:
        assert store.migrate() == versions("postgres")
        assert store.migrate() == []
    with psycopg.connect(empty_pg_url) as conn:
        recorded = conn.execute(
            f"SELECT version, applied_at IS NOT NULL FROM {MIGRATIONS_TABLE} ORDER BY version"
        ).fetchall()
    assert recorded == [(version, True) for version in versions("postgres")]


def test_concurrent_postgres_migrations_apply_once(empty_pg_url: str) -> None:
    """Two processes migrating one fresh database at once both succeed; the advisory
    lock makes the second wait and then find everything applied.

    Holding the lock first, and releasing it only once both migrations wait on it,
    makes the race certain rather than likely."""
    prepare = _queries.load("postgres")["migrations_prepare"]
    lock = re.search(r"pg_advisory_xact_lock\((\d+)\)", prepare)
    assert lock is not None, "migrations_prepare takes no advisory lock"
    lock_key = int(lock[1])
    with psycopg.connect(empty_pg_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key,))
        stores = [PostgresStore(empty_pg_url), PostgresStore(empty_pg_url)]
        try:
            with ThreadPoolExecutor(2) as pool:
                futures = [pool.submit(store.migrate) for store in stores]
                _wait_for_lock_waiters(holder, 2, futures)
                holder.commit()  # releases the lock
                results = [future.result(timeout=30) for future in futures]
        finally:
            for store in stores:
                store.close()

    assert sorted(results) == [[], versions("postgres")]
    with psycopg.connect(empty_pg_url) as conn:
        recorded = conn.execute(f"SELECT version FROM {MIGRATIONS_TABLE}").fetchall()
        assert sorted(version for (version,) in recorded) == versions("postgres")
        assert conn.execute("SELECT to_regclass('idempotency_keys') IS NOT NULL").fetchone() == (
            True,
        )


def _wait_for_lock_waiters(holder: psycopg.Connection[Any], count: int, futures: list[Any]) -> None:
    # A second connection sees pg_locks as it is now, not as of the holder's snapshot.
    with psycopg.connect(holder.info.dsn, autocommit=True) as watcher:
        deadline = time.monotonic() + 15
        while True:
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
            if waiting == (count,):
                return
            done = [future for future in futures if future.done()]
            if done:
                done[0].result()  # a migration that failed: show why
                pytest.fail("a migration finished while the lock was held")
            if time.monotonic() > deadline:
                pytest.fail(f"{count} migrations never waited on the advisory lock")
            time.sleep(0.01)


def test_postgres_store_without_schema_says_to_migrate(empty_pg_url: str) -> None:
    with PostgresStore(empty_pg_url) as store, pytest.raises(SchemaMissing) as raised:
        store.claim(REQUEST)
    assert "idempotence migrate" in raised.value.message


def test_postgres_schema_older_than_the_code_says_to_migrate(empty_pg_url: str) -> None:
    # A deployment that upgraded the library but not the schema: every migration but
    # the last applied by hand. The store fails closed with the fix in its message.
    *older, _latest = _queries.migrations("postgres")
    with psycopg.connect(empty_pg_url, autocommit=True) as conn:
        for _version, script in older:
            conn.execute(script)
    with PostgresStore(empty_pg_url) as store, pytest.raises(SchemaMissing) as raised:
        # The claim reads the row (k.*) without the newest column, or a later write
        # names it: whichever comes first refuses.
        claim = store.claim(REQUEST)
        assert claim.lease is not None
        store.finish(claim.lease, StoredResponse.of(201))
    assert "idempotence migrate" in raised.value.message
    assert "older than this release" in raised.value.message


# -- SQLite ------------------------------------------------------------------------------


def sqlite_snapshot(path: Path) -> dict[tuple[str, str], Any]:
    """Every object but the migrations table and its index: normalised SQL, and for
    tables their columns, indexes (with their columns) and foreign keys."""
    conn = sqlite3.connect(path)
    try:
        snapshot: dict[tuple[str, str], Any] = {}
        objects = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE tbl_name <> ? ORDER BY type, name",
            (MIGRATIONS_TABLE,),
        ).fetchall()
        for kind, name, sql in objects:
            entry: dict[str, Any] = {"sql": _normalized(sql)}
            if kind == "table":
                entry["columns"] = conn.execute(f'PRAGMA table_info("{name}")').fetchall()
                entry["indexes"] = sorted(
                    (index, unique, origin, partial, _index_columns(conn, index))
                    for _, index, unique, origin, partial in conn.execute(
                        f'PRAGMA index_list("{name}")'
                    )
                )
                entry["foreign_keys"] = conn.execute(
                    f'PRAGMA foreign_key_list("{name}")'
                ).fetchall()
            snapshot[kind, name] = entry
        return snapshot
    finally:
        conn.close()


def _index_columns(conn: sqlite3.Connection, index: str) -> list[tuple[Any, ...]]:
    return conn.execute(f'PRAGMA index_info("{index}")').fetchall()


def _normalized(sql: str | None) -> str | None:
    # SQLite keeps a CREATE statement's text as written, comments and layout included.
    if sql is None:
        return None
    sql = " ".join(re.sub(r"--[^\n]*", "", sql).split())
    return re.sub(r"\s*([(),])\s*", r"\1", sql)


def test_d3_sqlite_schema_equals_the_sum_of_migrations(tmp_path: Path) -> None:
    from_schema, migrated = tmp_path / "schema.sqlite3", tmp_path / "migrated.sqlite3"
    conn = sqlite3.connect(from_schema)
    try:
        conn.executescript(_queries.schema("sqlite"))
    finally:
        conn.close()
    with SqliteStore(str(migrated)) as store:
        assert store.migrate() == versions("sqlite")

    expected = sqlite_snapshot(from_schema)
    assert ("table", "idempotency_keys") in expected
    assert ("index", "idempotency_keys_locked_idx") in expected
    assert sqlite_snapshot(migrated) == expected


def test_migrate_sqlite_is_idempotent_and_records_versions(tmp_path: Path) -> None:
    path = str(tmp_path / "keys.sqlite3")
    with SqliteStore(path) as store:
        assert store.migrate() == versions("sqlite")
        assert store.migrate() == []
    conn = sqlite3.connect(path)
    try:
        recorded = conn.execute(
            f"SELECT version, applied_at IS NOT NULL FROM {MIGRATIONS_TABLE} ORDER BY version"
        ).fetchall()
    finally:
        conn.close()
    assert recorded == [(version, 1) for version in versions("sqlite")]


def test_sqlite_store_without_schema_says_to_migrate(tmp_path: Path) -> None:
    with (
        SqliteStore(str(tmp_path / "empty.sqlite3")) as store,
        pytest.raises(SchemaMissing) as raised,
    ):
        store.claim(REQUEST)
    assert "idempotence migrate" in raised.value.message


@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
def test_migration_versions_sort_in_the_order_they_apply(dialect: str) -> None:
    """Migrations apply in name order, so every name starts with four digits."""
    assert versions(dialect)[0] == "0001_initial"
    assert all(re.fullmatch(r"\d{4}_[a-z0-9_]+", version) for version in versions(dialect))


# -- 0005_calling: the attempt mark moves out of the recovery point (R6) -----------------

#: Rows as the code before 0005_calling wrote them: a non-idempotent call's attempt
#: was marked in the recovery point as '<point>~calling:<name>'.
OLD_ROWS = [
    ("crashed", "ride_created~calling:charge", "ride_created", "charge"),
    ("resumable", "ride_created", "ride_created", None),
    ("finished", "finished", "finished", None),
]


def _before_calling(dialect: str) -> list[tuple[str, str]]:
    names = versions(dialect)
    assert "0005_calling" in names
    return _queries.migrations(dialect)[: names.index("0005_calling")]


def _assert_converted(store: Any) -> None:
    for key, _old, point, calling in OLD_ROWS:
        record = store.get("acct_old", key)
        assert record is not None
        assert (record.recovery_point, record.calling) == (point, calling), key
    # The claim after the upgrade hands the call to the engine on the lease.
    claim = store.claim(
        ClaimRequest(scope="acct_old", key="crashed", fingerprint="f" * 64, flow="rides")
    )
    assert claim.lease is not None
    assert (claim.lease.recovery_point, claim.lease.calling) == ("ride_created", "charge")


def test_0005_converts_old_attempt_marks_on_postgres(empty_pg_url: str) -> None:
    prepare = _queries.load("postgres")["migrations_prepare"]
    with psycopg.connect(empty_pg_url, autocommit=True) as conn:
        conn.execute(prepare)
        for version, script in _before_calling("postgres"):
            conn.execute(script)
            conn.execute(f"INSERT INTO {MIGRATIONS_TABLE} (version) VALUES (%s)", (version,))
        for key, old, _point, _calling in OLD_ROWS:
            conn.execute(
                "INSERT INTO idempotency_keys (scope, key, request_method, request_path,"
                " fingerprint, flow, recovery_point, lock_token, lock_timeout,"
                " response_status, finished_at)"
                " VALUES ('acct_old', %s, 'POST', '/rides', %s, 'rides', %s, 2,"
                " interval '60 seconds', %s, %s)",
                (
                    key,
                    "f" * 64,
                    old,
                    201 if old == "finished" else None,
                    "2026-01-01T00:00:00Z" if old == "finished" else None,
                ),
            )
    with PostgresStore(empty_pg_url) as store:
        assert store.migrate() == ["0005_calling"]
        _assert_converted(store)


def test_0005_converts_old_attempt_marks_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    try:
        conn.executescript(_queries.load("sqlite")["migrations_prepare"])
        for version, script in _before_calling("sqlite"):
            conn.executescript(script)
            conn.execute(f"INSERT INTO {MIGRATIONS_TABLE} (version) VALUES (?)", (version,))
        for key, old, _point, _calling in OLD_ROWS:
            conn.execute(
                "INSERT INTO idempotency_keys (scope, key, request_method, request_path,"
                " fingerprint, flow, recovery_point, lock_token, lock_timeout, created_at,"
                " response_status, finished_at)"
                " VALUES ('acct_old', ?, 'POST', '/rides', ?, 'rides', ?, 2, 60.0,"
                " 1767225600.0, ?, ?)",
                (
                    key,
                    "f" * 64,
                    old,
                    201 if old == "finished" else None,
                    1767225600.0 if old == "finished" else None,
                ),
            )
        conn.commit()
    finally:
        conn.close()
    with SqliteStore(str(path)) as store:
        assert store.migrate() == ["0005_calling"]
        _assert_converted(store)
