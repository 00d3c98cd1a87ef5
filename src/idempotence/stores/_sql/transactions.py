"""The statements of a transaction and of a savepoint, for a connection that sends its
own BEGIN and COMMIT: what
[`Dialect.transaction_statements`][idempotence.stores.sql.Dialect.transaction_statements]
returns."""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TransactionStatements:
    """The statements that open, commit and roll back one transaction or savepoint."""

    begin: str
    commit: str
    rollback: tuple[str, ...]
    """Run in order."""


# A savepoint's name need only differ from those of the transactions around it: one
# count for every connection does that.
_savepoints = itertools.count(1)


def savepoint_name() -> str:
    """A savepoint name no open transaction uses."""
    return f"idempotence_{next(_savepoints)}"
