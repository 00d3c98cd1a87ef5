"""SQLAlchemy 2: the key store on the application's engine, so that a guarded endpoint's
or a flow phase's ORM writes commit in one transaction with the claim and the stored
response (R2, F3); and the key tables as SQLAlchemy metadata, for Alembic.

```python
engine = create_async_engine("postgresql+psycopg://app@db/app")
Session = async_sessionmaker(engine)
store = AsyncSQLAlchemyStore(Session)
# the middleware, as for any store; an endpoint with Policy(transaction=True):
@app.post("/transfers")
async def create(transfer: Transfer, session: SessionDep) -> dict[str, int]:
    session.add(TransferRow(amount=transfer.amount))     # commits with the key
    return {"amount": transfer.amount}
```

PostgreSQL with psycopg 3 (``postgresql+psycopg://``, sync and async) and SQLite
(``sqlite://`` and ``sqlite+aiosqlite://``). See `_sqlalchemy_async` for who begins and
commits what, and [`idempotence.contrib.alembic`][idempotence.contrib.alembic] for the
tables.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ..errors import ConfigurationError
from ..http._context import current_async_transaction, current_transaction
from ._sqlalchemy import SQLAlchemyStore, SQLAlchemyTransaction
from ._sqlalchemy_async import AsyncSQLAlchemyStore, AsyncSQLAlchemyTransaction
from ._sqlalchemy_shared import AsyncSession, Session

__all__ = [
    "AsyncSQLAlchemyStore",
    "AsyncSQLAlchemyTransaction",
    "SQLAlchemyStore",
    "SQLAlchemyTransaction",
    "async_session_dependency",
    "current_async_session",
    "current_session",
    "session_dependency",
]


def current_session() -> Session:
    """The ORM session of the request-as-transaction endpoint running now (F3), on a
    [`SQLAlchemyStore`][idempotence.contrib.sqlalchemy.SQLAlchemyStore] (WSGI): what it
    writes commits with the key."""
    tx = current_transaction()
    if not isinstance(tx, SQLAlchemyTransaction):
        raise ConfigurationError("current_session() needs the middleware on a SQLAlchemyStore")
    return tx.session


def current_async_session() -> AsyncSession:
    """[`current_session`][idempotence.contrib.sqlalchemy.current_session] on an
    [`AsyncSQLAlchemyStore`][idempotence.contrib.sqlalchemy.AsyncSQLAlchemyStore]
    (ASGI); in FastAPI a dependency as it is: ``session: AsyncSession =
    Depends(current_async_session)``."""
    tx = current_async_transaction()
    if not isinstance(tx, AsyncSQLAlchemyTransaction):
        raise ConfigurationError(
            "current_async_session() needs the middleware on an AsyncSQLAlchemyStore"
        )
    return tx.session


def async_session_dependency(
    sessions: Callable[[], AsyncSession],
) -> Callable[[], AsyncIterator[AsyncSession]]:
    """A FastAPI dependency for every endpoint: in a request-as-transaction endpoint
    the request's session (committed by the store with the key, never here);
    elsewhere a session of ``sessions`` in a transaction of its own, committed when
    the endpoint returns (rolled back if it raises), as the usual dependency does.

    ```python
    SessionDep = Annotated[AsyncSession, Depends(async_session_dependency(Session))]
    ```
    """

    async def dependency() -> AsyncIterator[AsyncSession]:
        tx = _current(current_async_transaction)
        if isinstance(tx, AsyncSQLAlchemyTransaction):
            yield tx.session
            return
        async with sessions() as session, session.begin():
            yield session

    return dependency


def session_dependency(sessions: Callable[[], Session]) -> Callable[[], Iterator[Session]]:
    """The sync twin of
    [`async_session_dependency`][idempotence.contrib.sqlalchemy.async_session_dependency]."""

    def dependency() -> Iterator[Session]:
        tx = _current(current_transaction)
        if isinstance(tx, SQLAlchemyTransaction):
            yield tx.session
            return
        with sessions() as session, session.begin():
            yield session

    return dependency


def _current(getter: Callable[[], Any]) -> Any:
    try:
        return getter()
    except ConfigurationError:  # not in a request-as-transaction endpoint
        return None
