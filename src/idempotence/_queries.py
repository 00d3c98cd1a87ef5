"""Load the named queries of a dialect's ``queries.sql``.

A query file is a sequence of blocks, each opened by a ``-- name --`` line and
followed by comment lines that describe it and the statement itself. Reading one
file is reading every statement a store runs.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable

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


def folder(dialect: str | Traversable) -> Traversable:
    """The folder of a dialect's SQL files: a built-in dialect's by its name
    (``idempotence/sql/<name>/``), or the folder a dialect outside the package names."""
    if isinstance(dialect, str):
        return resources.files("idempotence").joinpath("sql", dialect)
    return dialect


_loaded: dict[str, dict[str, str]] = {}
"""The queries read so far, by the folder's path: each file is read once a process."""


def load(dialect: str | Traversable) -> dict[str, str]:
    """The queries of ``dialect`` (its ``queries.sql``), read once."""
    where = folder(dialect)
    queries = _loaded.get(str(where))
    if queries is None:
        queries = _loaded[str(where)] = parse(where.joinpath("queries.sql").read_text())
    return queries


def schema(dialect: str | Traversable) -> str:
    """The dialect's whole current schema (``schema.sql``)."""
    return folder(dialect).joinpath("schema.sql").read_text()


def migrations(dialect: str | Traversable) -> list[tuple[str, str]]:
    """The dialect's migrations as ``(version, sql)`` in the order they apply."""
    found = sorted(
        (entry.name.removesuffix(".sql"), entry.read_text())
        for entry in folder(dialect).joinpath("migrations").iterdir()
        if entry.name.endswith(".sql")
    )
    return found


def _title(dialect: str) -> str:
    """How people name the dialect of a migration folder: its backend's title."""
    # Imported here: the backends' table imports the stores, which read this module.
    from ._backends import BACKENDS

    return next((b.title for b in BACKENDS if b.name == dialect), dialect)


def numbering_gaps(dialect: str, versions: list[str]) -> list[str]:
    """Why ``versions`` (the dialect's, in order) skip numbers: the migrations are
    numbered alike across dialects, and one another dialect needs and this one does
    not keeps its number. One phrase per skipped number, naming whose it is.

    Args:
        dialect: The folder under ``sql/`` (``postgres``, ``sqlite``).
        versions: Migration versions of that dialect, such as ``0001_initial``.

    Returns:
        One phrase per number skipped between the first and the last of ``versions``.

    Example:
        ```python
        numbering_gaps("sqlite", ["0003_maintenance", "0005_calling"])
        # ["0004 skipped: 0004_waiters is for PostgreSQL only; SQLite needs no change for it"]
        ```
    """
    numbers = sorted({int(version.split("_", 1)[0]) for version in versions})
    if not numbers:
        return []
    folder = resources.files("idempotence").joinpath("sql")
    others = {
        entry.name: [version for version, _ in migrations(entry.name)]
        for entry in folder.iterdir()
        if entry.name != dialect and entry.joinpath("migrations").is_dir()
    }
    phrases = []
    for number in range(numbers[0], numbers[-1]):
        if number in numbers:
            continue
        owners = sorted(
            (_title(other), version)
            for other, found in others.items()
            for version in found
            if int(version.split("_", 1)[0]) == number
        )
        here = _title(dialect)
        if owners:
            whose = " and ".join(name for name, _ in owners)
            names = ", ".join(version for _, version in owners)
            phrases.append(
                f"{number:04d} skipped: {names} is for {whose} only; {here} needs no change for it"
            )
    return phrases
