"""The usual online env.py, with the library's include_name hook."""

import os

import sqlalchemy as sa
from alembic import context
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from idempotence.contrib import alembic as idempotence


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    amount: Mapped[int]


engine = sa.create_engine(os.environ["DATABASE_URL"])
with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        include_name=idempotence.include_name,
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
