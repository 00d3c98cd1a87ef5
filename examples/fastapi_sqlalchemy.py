"""A FastAPI application written the usual way (SQLAlchemy 2 models, an async session
dependency), made exactly-once by the idempotence middleware on an
``AsyncSQLAlchemyStore``: the key's claim, the ORM writes and the stored response
commit in one transaction, so a crash anywhere leaves all of them or none.

    IDEMPOTENCE_DATABASE_URL=postgresql://app@db/app uvicorn fastapi_sqlalchemy:app
    # default: sqlite:///app.sqlite3 in the working directory (through aiosqlite)

Run by tests/sqla/test_fastapi_example.py under a real uvicorn.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI
from pydantic import BaseModel
from sqlalchemy import String, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from idempotence.contrib.sqlalchemy import AsyncSQLAlchemyStore, async_session_dependency
from idempotence.http import Endpoint, Idempotency, IdempotencyMiddleware, Policy, header_scope

# The URL the CLI reads too; SQLAlchemy talks to it through an async driver.
ASYNC_DRIVERS = {"postgresql": "postgresql+psycopg", "sqlite": "sqlite+aiosqlite"}
url = make_url(os.environ.get("IDEMPOTENCE_DATABASE_URL", "sqlite:///app.sqlite3"))
engine = create_async_engine(url.set(drivername=ASYNC_DRIVERS.get(url.drivername, url.drivername)))
Session = async_sessionmaker(engine, expire_on_commit=False)


class Base(DeclarativeBase):
    pass


class Transfer(Base):
    __tablename__ = "orm_transfers"

    id: Mapped[int] = mapped_column(primary_key=True)
    account: Mapped[str] = mapped_column(String(64))
    amount: Mapped[int]


class TransferIn(BaseModel):
    amount: int


# The one configuration line: the key store on the application's own sessions.
store = AsyncSQLAlchemyStore(Session)
# The application's session dependency: in a guarded endpoint, the request's session
# (the store commits it with the key); elsewhere a session committed as usual.
SessionDep = Annotated[AsyncSession, Depends(async_session_dependency(Session))]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await store.migrate()  # the key tables; Alembic users: idempotence.contrib.alembic
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    yield
    await store.close()
    await engine.dispose()


app = FastAPI(lifespan=lifespan)
app.add_middleware(
    IdempotencyMiddleware,
    config=Idempotency(
        store=store,
        scope=header_scope("x-account-id"),  # set by the authenticating gateway
        endpoints=[Endpoint("POST /transfers", Policy(transaction=True))],
    ),
)


@app.post("/transfers", status_code=201)
async def create_transfer(body: TransferIn, session: SessionDep) -> dict[str, int]:
    transfer = Transfer(account="acct_1", amount=body.amount)
    session.add(transfer)
    await session.flush()  # the row's id; it commits with the key, or not at all
    return {"id": transfer.id, "amount": transfer.amount}


@app.get("/transfers/count")
async def count_transfers(session: SessionDep) -> dict[str, int]:
    return {"count": (await session.scalar(select(func.count()).select_from(Transfer))) or 0}
