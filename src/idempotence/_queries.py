"""Load the named queries of a dialect's ``queries.sql``.

A query file is a sequence of blocks, each opened by a ``-- name --`` line and
followed by comment lines that describe it and the statement itself. Reading one
file is reading every statement a store runs.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a query file into ``{name: statement}``; comments are stripped."""
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        statement = "\n".join(lines).strip().rstrip(";").strip()
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = statement
    return queries


@functools.cache
def load(dialect: str) -> dict[str, str]:
    """The queries of ``dialect`` (``postgres`` or ``sqlite``)."""
    text = resources.files("idempotence").joinpath("sql", dialect, "queries.sql").read_text()
    return parse(text)


def schema(dialect: str) -> str:
    """The dialect's whole current schema (``schema.sql``)."""
    return resources.files("idempotence").joinpath("sql", dialect, "schema.sql").read_text()


def migrations(dialect: str) -> list[tuple[str, str]]:
    """The dialect's migrations as ``(version, sql)`` in the order they apply."""
    folder = resources.files("idempotence").joinpath("sql", dialect, "migrations")
    found = sorted(
        (entry.name.removesuffix(".sql"), entry.read_text())
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    )
    return found
