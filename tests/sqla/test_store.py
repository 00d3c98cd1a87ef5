"""The SQLAlchemy store's transaction is the application's: the claim, the ORM
writes of ``tx.session`` and the stored response commit together (F3, R2), or roll
back together; the session's own commit and rollback cannot split them; a duplicate
does not wait for the open transaction (F8). PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from idempotence import ClaimRequest, Outcome, StoredResponse, TransactionEnded
from idempotence.contrib.sqlalchemy import (
    AsyncSQLAlchemyStore,
    SQLAlchemyStore,
    current_async_session,
)
from idempotence.errors import ConfigurationError
from idempotence.flows import Finish, Flow, ResultKind
from tests.sqla.conftest import Database


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "rows"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(sa.String(100))


RESPONSE = StoredResponse.of(201, {"content-type": "application/json"}, b'{"ok":true}')


@pytest.fixture
def store(database: Database) -> Iterator[SQLAlchemyStore]:
    engine = sa.create_engine(database.sync_url)
    store = SQLAlchemyStore(sessionmaker(engine))
    store.migrate()
    Base.metadata.create_all(engine)
    try:
        yield store
    finally:
        store.close()
        engine.dispose()


def request(key: str | None = None) -> ClaimRequest:
    return ClaimRequest(scope="acct_1", key=key or str(uuid.uuid4()), fingerprint="f" * 64)


def census(store: Any, key: str) -> tuple[int, Outcome | None]:
    """(rows written for ``key``, the outcome a claim of it would get), read outside."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(sa.func.count()).where(Row.key == key)).scalar_one()
    record = store.get("acct_1", key)
    return rows, None if record is None else (Outcome.REPLAY if record.response else None)


def test_f3_the_claim_the_orm_writes_and_the_response_commit_together(
    store: SQLAlchemyStore,
) -> None:
    claim = request()
    with store.transaction(claim=claim) as tx:
        assert tx.claim is not None and tx.claim.lease is not None
        assert tx.claim.outcome is Outcome.EXECUTE
        tx.session.add(Row(key=claim.key))
        tx.session.commit()  # the application's commit: a flush, not the COMMIT
        # Seen from outside, nothing has happened yet: neither the row nor the key.
        assert _outside(store, claim.key) == (0, None)
        store.finish(tx.claim.lease, RESPONSE, tx=tx, at_commit=True)
    assert census(store, claim.key) == (1, Outcome.REPLAY)
    assert store.claim(claim).response == RESPONSE


def _outside(store: Any, key: str) -> tuple[int, Any]:
    # Another thread: the store's own thread is inside its transaction (and the gate
    # refuses it a second connection there, by design).
    result: list[Any] = []
    reader = threading.Thread(target=lambda: result.append(census(store, key)))
    reader.start()
    reader.join(timeout=30)
    return result[0]


def test_r5_an_exception_rolls_back_the_claim_and_the_orm_writes(store: SQLAlchemyStore) -> None:
    claim = request()
    with pytest.raises(RuntimeError, match="handler failed"), store.transaction(claim=claim) as tx:
        tx.session.add(Row(key=claim.key))
        tx.session.flush()
        raise RuntimeError("handler failed")
    assert census(store, claim.key) == (0, None)
    with store.transaction(claim=claim) as tx:  # nothing was stored: it runs again
        assert tx.claim is not None and tx.claim.outcome is Outcome.EXECUTE


def test_a_session_rollback_aborts_the_whole_transaction_and_says_so(
    store: SQLAlchemyStore,
) -> None:
    claim = request()
    refused = pytest.raises(ConfigurationError, match="ended by the application")
    with refused, store.transaction(claim=claim) as tx:
        assert tx.claim is not None and tx.claim.lease is not None
        tx.session.add(Row(key=claim.key))
        tx.session.flush()
        tx.session.rollback()  # the claim goes with it
        store.finish(tx.claim.lease, RESPONSE, tx=tx, at_commit=True)
    assert census(store, claim.key) == (0, None)


def test_r2_a_transaction_kept_past_its_block_refuses_its_session_and_tx(
    store: SQLAlchemyStore,
) -> None:
    claim = request()
    with store.transaction(claim=claim) as kept:
        assert kept.claim is not None and kept.claim.lease is not None
        lease = kept.claim.lease
    for use in (
        lambda: kept.session,
        lambda: kept.connection,
        lambda: kept.execute("DELETE FROM rows"),
        lambda: store.finish(lease, RESPONSE, tx=kept, at_commit=True),
    ):
        with pytest.raises(TransactionEnded, match="block has ended"):
            use()
    assert census(store, claim.key) == (0, None)  # claimed, and nothing else written
    store.finish(lease, RESPONSE)
    assert census(store, claim.key) == (0, Outcome.REPLAY)


# SQLite has one writer: there a duplicate's BEGIN IMMEDIATE waits for the first
# transaction (busy_timeout), as on the SQLite store's own connections.
@pytest.mark.parametrize("database", ["postgres"], indirect=True)
def test_f8_a_duplicate_does_not_wait_for_the_open_transaction(store: SQLAlchemyStore) -> None:
    claim = request()
    entered, leave = threading.Event(), threading.Event()

    def first() -> None:
        with store.transaction(claim=claim) as tx:
            assert tx.claim is not None and tx.claim.lease is not None
            tx.session.add(Row(key=claim.key))
            entered.set()
            leave.wait(30)
            store.finish(tx.claim.lease, RESPONSE, tx=tx, at_commit=True)

    holder = threading.Thread(target=first)
    holder.start()
    try:
        assert entered.wait(30)
        started = time.monotonic()
        with store.transaction(claim=claim) as tx:
            assert tx.claim is not None
            assert tx.claim.outcome is Outcome.IN_PROGRESS
        assert time.monotonic() - started < 5  # bounded, not the holder's whole run
    finally:
        leave.set()
        holder.join(30)
    assert census(store, claim.key) == (1, Outcome.REPLAY)


def test_f3_async_the_sessions_commit_is_not_the_transactions(database: Database) -> None:
    async def scenario() -> tuple[int, int, Outcome]:
        engine = create_async_engine(database.async_url)
        store = AsyncSQLAlchemyStore(async_sessionmaker(engine))
        try:
            await store.migrate()
            async with engine.begin() as conn:
                await conn.run_sync(Base.metadata.create_all)
            claim = request()
            async with store.transaction(claim=claim) as tx:
                assert tx.claim is not None and tx.claim.lease is not None
                tx.session.add(Row(key=claim.key))
                await tx.session.commit()
                async with engine.connect() as other:  # another connection: nothing yet
                    before = await other.scalar(
                        sa.select(sa.func.count()).where(Row.key == claim.key)
                    )
                await store.finish(tx.claim.lease, RESPONSE, tx=tx, at_commit=True)
            async with engine.connect() as other:
                after = await other.scalar(sa.select(sa.func.count()).where(Row.key == claim.key))
            return before or 0, after or 0, (await store.claim(claim)).outcome
        finally:
            await store.close()
            await engine.dispose()

    assert asyncio.run(scenario()) == (0, 1, Outcome.REPLAY)


def test_current_async_session_outside_a_guarded_request_says_so() -> None:
    with pytest.raises(ConfigurationError, match="Policy\\(transaction=True\\)"):
        current_async_session()


def test_the_store_refuses_an_engine_it_cannot_drive(database: Database) -> None:
    engine = sa.create_engine(database.sync_url)
    with pytest.raises(ConfigurationError, match="SQLAlchemyStore takes the application's engine"):
        SQLAlchemyStore(sessionmaker())  # a sessionmaker bound to nothing
    with pytest.raises(
        ConfigurationError, match="AsyncSQLAlchemyStore takes the application's engine"
    ):
        AsyncSQLAlchemyStore(engine)  # type: ignore[arg-type]
    engine.dispose()


def _bound_flow(expected_session: Any) -> Flow:
    flow = Flow(f"bound-{uuid.uuid4().hex[:8]}", request_as_transaction=True)

    @flow.phase("started")
    def write(ctx: Any) -> Finish:
        assert ctx.tx.session is expected_session  # the application's own session
        ctx.tx.session.add(Row(key=ctx.record.key))
        return Finish(RESPONSE)

    return flow


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_f3_a_store_bound_to_the_applications_session_commits_with_it(
    store: SQLAlchemyStore, ending: str
) -> None:
    claim = request()
    with Session(store.engine) as session:
        flow = _bound_flow(session)
        result = flow.run(
            SQLAlchemyStore(session),
            flow.request(scope=claim.scope, key=claim.key, fingerprint=claim.fingerprint),
        )
        assert result.kind is ResultKind.EXECUTED
        # The claim, the row and the response are in the application's transaction,
        # which the store did not commit (its block was a savepoint of it).
        assert _outside(store, claim.key) == (0, None)
        getattr(session, ending)()
    expected = (1, Outcome.REPLAY) if ending == "commit" else (0, None)
    assert census(store, claim.key) == expected


def test_f3_async_a_store_bound_to_the_applications_session(database: Database) -> None:
    async def scenario() -> tuple[int, Outcome]:
        engine = create_async_engine(database.async_url)
        try:
            store = AsyncSQLAlchemyStore(engine)
            await store.migrate()
            async with engine.begin() as conn:
                await conn.run_sync(Base.metadata.create_all)
            key = str(uuid.uuid4())
            async with AsyncSession(engine) as session:
                flow = _bound_flow(session)
                request = flow.request(scope="acct_1", key=key, fingerprint="f" * 64)
                result = await flow.run_async(AsyncSQLAlchemyStore(session), request)
                assert result.kind is ResultKind.EXECUTED
                await session.commit()
            async with engine.connect() as conn:
                rows = await conn.scalar(sa.select(sa.func.count()).where(Row.key == key))
            return rows or 0, (await store.claim(request)).outcome
        finally:
            await engine.dispose()

    assert asyncio.run(scenario()) == (1, Outcome.REPLAY)
