"""A MariaDB query as the statements the connection sends, and the rules that join
their results (pure: no I/O).

MariaDB has no ``UPDATE ... RETURNING`` and runs one statement per call, so a query of
``sql/mariadb/queries.sql`` may be a short script (its header says how one reads):
`plan` turns its text into `Step` objects once; the connection runs them in the
caller's transaction, and `selected` and `with_selected` carry the ids a SELECT found
to the statements after it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_END = re.compile(r";[ \t]*(?:\n|$)")
"""Statements of a script end with a semicolon at the end of a line."""
_UPDATE_RETURNING = re.compile(
    r"^(?P<update>UPDATE\s+(?P<table>\w+)\s.*?\sWHERE\s+"
    r"(?P<row>(?:scope = %\(scope\)s AND )?id = %\(id\)s)\b(?P<rest>.*?))"
    r"\s+RETURNING\s+(?P<columns>.+)$",
    re.DOTALL | re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Step:
    """One statement of a query."""

    sql: str
    echo: tuple[tuple[str, str], ...] | None = None
    """For an ``UPDATE ... RETURNING`` whose WHERE fixes every returned column to a
    parameter (``id = %(id)s``, ``lock_token = %(token)s``): the row it returns, as
    (column, parameter) pairs, with no statement to read it back."""


@functools.cache
def plan(sql: str) -> tuple[Step, ...]:
    """The statements of the query ``sql``, in the order they run (cached per text).

    An ``UPDATE`` that ends with ``RETURNING columns`` becomes the UPDATE, then a
    read of those columns from its one row, by the id its WHERE clause starts with;
    when the WHERE fixes every one of those columns to a parameter, the row is those
    parameters instead, and no read is sent. Anything else is a step as written.

    Raises:
        ValueError: an ``UPDATE ... RETURNING`` whose WHERE does not start with the
            row's key (``scope = %(scope)s AND id = %(id)s`` or ``id = %(id)s``): which
            rows to read back would be a guess.

    Example:
        ```python
        steps = plan("UPDATE t SET a = 1 WHERE id = %(id)s AND b = 2 RETURNING a")
        assert [step.sql for step in steps] == [
            "UPDATE t SET a = 1 WHERE id = %(id)s AND b = 2",
            "SELECT a FROM t WHERE id = %(id)s",
        ]
        ```
    """
    steps: list[Step] = []
    for statement in (part.strip() for part in _END.split(sql)):
        if not statement:
            continue
        head = statement.split(None, 1)[0].upper()
        if head == "UPDATE" and re.search(r"\sRETURNING\s", statement, re.IGNORECASE):
            found = _UPDATE_RETURNING.match(statement)
            if found is None:
                raise ValueError(
                    "an UPDATE ... RETURNING must name its one row first in its WHERE "
                    f"(scope = %(scope)s AND id = %(id)s, or id = %(id)s): {statement}"
                )
            echo = _fixed(found["row"] + found["rest"], found["columns"])
            steps.append(Step(found["update"], echo))
            if echo is None:
                read = f"SELECT {found['columns']} FROM {found['table']} WHERE {found['row']}"
                steps.append(Step(read))
        else:
            steps.append(Step(statement))
    return tuple(steps)


def _fixed(where: str, columns: str) -> tuple[tuple[str, str], ...] | None:
    """The (column, parameter) pairs of ``columns`` when ``where`` (a conjunction)
    sets each to a parameter, else None."""
    pairs = []
    for column in (part.strip() for part in columns.split(",")):
        if not re.fullmatch(r"\w+", column):
            return None
        fixed = re.search(rf"(?:^|\sAND\s+){column} = %\((\w+)\)s(?:\s|$)", where)
        if fixed is None or re.search(r"\sOR\s", where, re.IGNORECASE):
            return None
        pairs.append((column, fixed[1]))
    return tuple(pairs)


def selected(rows: list[dict[str, object]]) -> list[int]:
    """The ids of a SELECT's rows: ``%(selected)s`` in the statements after it."""
    return [int(row["id"]) for row in rows if row["id"] is not None]  # type: ignore[call-overload]


def with_selected(sql: str, ids: list[int]) -> str:
    """``sql`` with ``%(selected)s`` written out as the list ``(1, 2, 3)``: integers
    the database gave, so no escaping is needed (PyMySQL deprecates list parameters)."""
    return sql.replace("%(selected)s", "(" + ", ".join(str(int(i)) for i in ids) + ")")
