"""A MariaDB query as the statements the connection sends, and the rules that join
their results (pure: no I/O).

MariaDB has no ``UPDATE ... RETURNING`` and runs one statement per call, so a query of
``sql/mariadb/queries.sql`` may be a short script (its header says how one reads):
:func:`plan` turns its text into statements once; the connection runs them in the
caller's transaction, and :func:`ended` and :func:`selected` say what each result means
for the statements after it.
"""

from __future__ import annotations

import functools
import re

#: Statements of a script end with a semicolon at the end of a line.
_END = re.compile(r";[ \t]*(?:\n|$)")
_UPDATE_RETURNING = re.compile(
    r"^(?P<update>UPDATE\s+(?P<table>\w+)\s.*?\sWHERE\s+"
    r"(?P<row>(?:scope = %\(scope\)s AND )?id = %\(id\)s)\b.*?)"
    r"\s+RETURNING\s+(?P<columns>.+)$",
    re.DOTALL | re.IGNORECASE,
)


@functools.cache
def plan(sql: str) -> tuple[str, ...]:
    """The statements of the query ``sql``, in the order they run (cached per text).

    An ``UPDATE`` that ends with ``RETURNING columns`` becomes the UPDATE and then a
    read of those columns from its one row, by the id its WHERE clause starts with.
    Anything else is a step as written.

    Raises:
        ValueError: an ``UPDATE ... RETURNING`` whose WHERE does not start with the
            row's key (``scope = %(scope)s AND id = %(id)s`` or ``id = %(id)s``): which
            rows to read back would be a guess.

    Example:
        ```python
        steps = plan("UPDATE t SET a = 1 WHERE id = %(id)s AND b = 2 RETURNING a")
        assert steps == (
            "UPDATE t SET a = 1 WHERE id = %(id)s AND b = 2",
            "SELECT a FROM t WHERE id = %(id)s",
        )
        ```
    """
    steps: list[str] = []
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
            steps.append(found["update"])
            steps.append(f"SELECT {found['columns']} FROM {found['table']} WHERE {found['row']}")
        else:
            steps.append(statement)
    return tuple(steps)


def selected(rows: list[dict[str, object]]) -> list[int]:
    """The ids of a SELECT's rows: ``%(selected)s`` in the statements after it."""
    return [int(row["id"]) for row in rows if row["id"] is not None]  # type: ignore[call-overload]


def with_selected(sql: str, ids: list[int]) -> str:
    """``sql`` with ``%(selected)s`` written out as the list ``(1, 2, 3)``: integers
    the database gave, so no escaping is needed (PyMySQL deprecates list parameters)."""
    return sql.replace("%(selected)s", "(" + ", ".join(str(int(i)) for i in ids) + ")")
