"""The key tables from ``alembic upgrade`` (idempotence.contrib.alembic), on PostgreSQL
and SQLite: the real Alembic command line on an application's project
(tests/sqla/alembic_project) builds the very schema ``idempotence migrate`` builds
(the catalogs are compared), the stores' schema check passes on it, autogenerate
leaves the tables alone, and a downgrade drops them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from idempotence import ClaimRequest, Outcome, SchemaMissing, SqliteStore, StoredResponse
from idempotence.contrib import alembic as idempotence_alembic
from idempotence.contrib.sqlalchemy import SQLAlchemyStore
from idempotence.stores._sql.ops import pending_migrations
from idempotence.stores.postgres import PostgresStore
from tests.sqla.conftest import ROOT, Database
from tests.support.postgres import ProvidedServer, create_database, drop_database
from tests.test_schema import pg_snapshot, sqlite_snapshot

PROJECT = Path(__file__).resolve().parent / "alembic_project"


def alembic(database: Database, *args: str) -> str:
    env = {**os.environ, "DATABASE_URL": database.sync_url}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(PROJECT / "alembic.ini"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def native_store(database: Database) -> Any:
    """The library's own store on the same database."""
    if database.backend == "postgres":
        return PostgresStore(database.sync_url.replace("postgresql+psycopg://", "postgresql://"))
    return SqliteStore(database.sync_url.removeprefix("sqlite:///"))


def snapshot(database: Database) -> Any:
    if database.backend == "postgres":
        return pg_snapshot(database.sync_url.replace("postgresql+psycopg://", "postgresql://"))
    return sqlite_snapshot(Path(database.sync_url.removeprefix("sqlite:///")))


@pytest.fixture
def migrated_elsewhere(database: Database, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """The snapshot of another empty database of the same kind after `idempotence
    migrate`, and the application's own table."""
    if database.backend == "sqlite":
        path = tmp_path / "reference.sqlite3"
        other = Database("sqlite", f"sqlite:///{path}", "")
    else:
        server: ProvidedServer = request.getfixturevalue("pg_server")
        url = create_database(server.url, prefix="idempotence_sqla_ref")
        other = Database("postgres", url.replace("postgresql://", "postgresql+psycopg://"), "")
    try:
        with native_store(other) as store:
            store.migrate()
        engine = sa.create_engine(other.sync_url)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER)")
        engine.dispose()
        yield snapshot(other)
    finally:
        if database.backend == "postgres":
            drop_database(server.url, url)


def test_alembic_upgrade_builds_the_migrated_schema_and_the_stores_accept_it(
    database: Database, migrated_elsewhere: Any
) -> None:
    alembic(database, "upgrade", "head")

    engine = sa.create_engine(database.sync_url)
    try:
        store = SQLAlchemyStore(engine)
        # The stores' schema check (what `idempotence worker` requires at start).
        assert store._perform(pending_migrations, write=False) == []
        assert store.migrate() == []  # `idempotence migrate` finds nothing to do
        request = ClaimRequest(scope="acct_1", key="alembic-1", fingerprint="f" * 64)
        with store.transaction(claim=request) as tx:
            assert tx.claim is not None and tx.claim.lease is not None
            assert tx.claim.outcome is Outcome.EXECUTE
            tx.session.execute(
                sa.text("INSERT INTO orders (amount) VALUES (:amount)"), {"amount": 5}
            )
            store.finish(tx.claim.lease, StoredResponse.of(201), tx=tx, at_commit=True)
        with native_store(database) as native:
            assert native._perform(pending_migrations, write=False) == []
            assert native.claim(request).outcome is Outcome.REPLAY
    finally:
        engine.dispose()

    # Not just accepted: the same catalog as `idempotence migrate` builds (the
    # application's tables aside: orders, and Alembic's own alembic_version).
    ours, reference = _library_only(snapshot(database)), _library_only(migrated_elsewhere)
    assert any("idempotency_keys" in str(name) for name in ours)
    assert ours == reference


def _library_only(snapshot: Any) -> Any:
    def application(name: Any) -> bool:
        text = name if isinstance(name, str) else name[1]
        return "orders" in text or "alembic_version" in text

    return {name: entry for name, entry in snapshot.items() if not application(name)}


def test_autogenerate_leaves_the_key_tables_alone(database: Database) -> None:
    alembic(database, "upgrade", "head")
    assert "No new upgrade operations detected" in alembic(database, "check")

    # The hook is what keeps them: without it, autogenerate would drop them.
    engine = sa.create_engine(database.sync_url)
    try:
        metadata = sa.MetaData()
        sa.Table(
            "orders",
            metadata,
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("amount", sa.Integer(), nullable=False),
        )
        with engine.connect() as conn:
            hooked = MigrationContext.configure(
                conn, opts={"include_name": idempotence_alembic.include_name}
            )
            assert compare_metadata(hooked, metadata) == []
            bare = MigrationContext.configure(conn)
            diffs = compare_metadata(bare, metadata)
            dropped = {diff[1].name for diff in diffs if diff[0] == "remove_table"}
        assert dropped == set(idempotence_alembic.tables(database_dialect(database)))
    finally:
        engine.dispose()


def database_dialect(database: Database) -> str:
    return "postgres" if database.backend == "postgres" else "sqlite"


def test_alembic_downgrade_drops_the_key_tables(database: Database) -> None:
    alembic(database, "upgrade", "head")
    alembic(database, "downgrade", "0001")
    with native_store(database) as store, pytest.raises(SchemaMissing):
        store.claim(ClaimRequest(scope="acct_1", key="gone", fingerprint="f" * 64))
    alembic(database, "upgrade", "head")  # and back
    with native_store(database) as store:
        assert store._perform(pending_migrations, write=False) == []
