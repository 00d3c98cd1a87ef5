"""What a store operation (`ops`) yields and is sent back: a statement, and its rows.

Apart from the operations, which every store module and runner imports them with: a
statement is built on every request (the claim, the finish, the application's own), so
it has a maker past the class call too (`new_query`).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..._frozen import quick_init, quick_new

T = TypeVar("T")
Row = dict[str, Any]
"""A row as a query returns it: column name to value."""


@quick_init
@dataclass(frozen=True, slots=True)
class Query:
    """One statement to run: its name in the query file, its text and parameters."""

    name: str
    sql: str
    params: Mapping[str, Any]


new_query = quick_new(Query)
"""A Query from its name, text and parameters, past the class call (see `quick_new`)."""

APPLICATION = "application"
"""The name of the application's own statements (``tx.execute``): their errors are
the application's (a missing table is not the key store's schema)."""

Op = Generator[Query, list[Row], T]
"""An operation: yields queries, is sent each query's rows, returns its result."""
