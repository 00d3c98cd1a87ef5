"""The migration operation that makes the key tables: the package's own SQL files.

Django's migrations of the app do not describe the tables: each applies the
package's migrations (``idempotence/sql/<vendor>/migrations/*.sql``) that the
database lacks, in the schema editor's transaction, and records them in
``idempotence_migrations`` exactly as ``idempotence migrate`` does. One schema, one
history, whichever tool ran: they cannot drift.

A release that adds a package migration adds a Django migration with
`ApplyKeyTables` naming it (a test holds the two lists together).
"""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations.base import Operation  # type: ignore[import-untyped]

from ...stores import sql
from .store import DjangoStore


class ApplyKeyTables(Operation):  # type: ignore[misc]
    """Apply the package's key-table migrations up to ``version`` (those not applied
    yet) on the migrating connection."""

    reversible = False
    reduces_to_sql = False

    def __init__(self, version: str) -> None:
        self.version = version

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (type(self).__qualname__, [self.version], {})

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass  # no models: the tables are the package's, not the ORM's

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        store = DjangoStore(schema_editor.connection.alias)
        store._perform(lambda d: sql.migrate(d, upto=self.version), write=True)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        raise NotImplementedError("the key tables' migrations are not reversible")

    def describe(self) -> str:
        return f"Apply the idempotence key tables' SQL migrations up to {self.version}"
