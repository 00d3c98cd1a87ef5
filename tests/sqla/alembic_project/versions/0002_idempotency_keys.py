"""The idempotence key tables, from the library's own migrations."""

from alembic import op

from idempotence.contrib import alembic as idempotence

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    idempotence.migrate(op)


def downgrade() -> None:
    idempotence.drop(op)
