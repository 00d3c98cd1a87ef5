"""A flow whose phases write through the SQLAlchemy ORM session of the phase's
transaction (``ctx.tx.session``), as a target of the crash harness (F4): an order row
in the first phase, a charge through the fake provider (a foreign call, no
transaction open), and a payment row with the stored response in the last phase."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from idempotence import ClaimRequest, KeyRecord, StoredResponse
from idempotence.contrib.sqlalchemy import AsyncSQLAlchemyStore, SQLAlchemyStore
from idempotence.flows import Advance, Finish, Flow, ForeignContext, PhaseContext
from idempotence.testing import FakeProvider, Target
from idempotence.testing.provider import Charge


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    scope: Mapped[str] = mapped_column(sa.String(100))
    key_id: Mapped[int]


class Payment(Base):
    __tablename__ = "payments"

    id: Mapped[int] = mapped_column(primary_key=True)
    scope: Mapped[str] = mapped_column(sa.String(100))
    key_id: Mapped[int]
    charge_id: Mapped[str] = mapped_column(sa.String(100))


def orders_flow(provider: FakeProvider, lock_timeout: float) -> Flow:
    flow = Flow("sqla_orders", lock_timeout=timedelta(seconds=lock_timeout))

    @flow.phase("started")
    def create_order(ctx: PhaseContext) -> Advance:
        ctx.tx.session.add(Order(scope=ctx.lease.scope, key_id=ctx.lease.id))
        return Advance("order_created")

    def charge(ctx: ForeignContext) -> Charge:
        return provider.charge(
            ctx.params["amount"],
            "tok_visa",
            idempotency_key=ctx.key_for("charge"),
            reference=f"{ctx.record.scope}/{ctx.record.key}",
        )

    def record(ctx: PhaseContext, charge: Charge) -> Finish:
        ctx.tx.session.add(Payment(scope=ctx.lease.scope, key_id=ctx.lease.id, charge_id=charge.id))
        body = json.dumps({"charge": charge.id})
        return Finish(StoredResponse.of(201, {"content-type": "application/json"}, body))

    flow.foreign("order_created", name="charge", call=charge, record=record)
    return flow


def prepare(url: str) -> None:
    """The key tables and the application's tables, in an empty database."""
    engine = sa.create_engine(url)
    try:
        SQLAlchemyStore(engine).migrate()
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()


def target(config: Mapping[str, Any]) -> Target:
    """``config``: ``url`` and ``async_url`` (SQLAlchemy), ``provider`` (a file)."""
    provider = FakeProvider(config["provider"])
    flow = orders_flow(provider, config.get("lock_timeout", 0.4))

    def request(scope: str, key: str) -> ClaimRequest:
        return flow.request(scope=scope, key=key, fingerprint="f" * 64, params={"amount": 1500})

    def census(store: Any, record: KeyRecord) -> dict[str, int]:
        counts: dict[str, int] = {}
        with store.transaction() as tx:
            for table in (Order, Payment):
                where = (table.scope == record.scope) & (table.key_id == record.id)
                query = sa.select(sa.func.count()).select_from(table).where(where)
                counts[table.__tablename__] = tx.session.scalar(query)
        counts["charges"] = len(provider.charges(reference=f"{record.scope}/{record.key}"))
        return counts

    engine = sa.create_engine(config["url"])
    async_engine = create_async_engine(config["async_url"])

    def instrument(observer: Any) -> None:
        provider.before_commit = lambda charge: observer("provider:charge:before_commit")
        provider.after_commit = lambda charge: observer("provider:charge:after_commit")
        for sync_engine in (engine, async_engine.sync_engine):
            _watch_commits(sync_engine, observer)

    return Target(
        flow=flow,
        open_store=lambda: SQLAlchemyStore(sessionmaker(engine)),
        request=request,
        census=census,
        instrument=instrument,
        open_async_store=lambda: AsyncSQLAlchemyStore(async_sessionmaker(async_engine)),
    )


def _watch_commits(engine: sa.Engine, observer: Any) -> None:
    """A boundary inside the database transaction: the COMMIT that follows a statement
    recording a recovery point (a checkpoint or the finish), just before it is sent.
    The ORM writes of the phase were sent before it: had they been committed on their
    own, earlier, a kill here would leave them behind and the retry would repeat them."""

    @event.listens_for(engine, "after_cursor_execute")
    def recorded(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        text = statement.lstrip()
        if text.startswith("UPDATE idempotency_keys") and "SET recovery_point =" in text:
            conn.info["recorded"] = True

    @event.listens_for(engine, "commit")
    def committing(conn: Any) -> None:
        if conn.info.pop("recorded", False):
            observer("sql:checkpoint:before_commit")
