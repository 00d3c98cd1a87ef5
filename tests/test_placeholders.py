"""``tx.execute(sql, params)`` takes ``:name`` on every SQL store (PostgreSQL, SQLite;
sync and async), on real databases, with SQL that a naive placeholder rewrite breaks.
The translation itself is unit-tested in ``tests/unit/test_placeholders.py``."""

from __future__ import annotations

from typing import Any

import pytest

from idempotence.errors import MixedPlaceholders

# Valid on both databases: colons and percent signs in literals, quoted identifiers
# and comments must come back as written; only :a and :b are parameters.
PORTABLE = """
    SELECT :a AS a,                 -- a comment with :a and 100%
           ':a' AS colon,           /* a block comment with :b and 5% */
           '100%' AS percent,
           'it''s :b' AS quoted,
           :b || '%%' AS doubled,
           1 AS "col:a"
"""


def test_named_placeholders_run_as_written_on_every_store(store: Any) -> None:
    with store.transaction() as tx:
        rows = tx.execute(PORTABLE, {"a": "value of a", "b": "b"})
    assert rows == [
        {
            "a": "value of a",
            "colon": ":a",
            "percent": "100%",
            "quoted": "it's :b",
            "doubled": "b%%",
            "col:a": 1,
        }
    ]


def test_named_placeholders_write_the_applications_rows(store: Any, scope: str) -> None:
    with store.transaction() as tx:
        tx.execute("CREATE TABLE IF NOT EXISTS placeholder_notes (scope TEXT, note TEXT)")
        tx.execute(
            "INSERT INTO placeholder_notes (scope, note) VALUES (:scope, :note)",
            {"scope": scope, "note": "50% off: :today"},
        )
    with store.transaction() as tx:
        rows = tx.execute(
            "SELECT note FROM placeholder_notes WHERE scope = :scope AND note LIKE '50%'",
            {"scope": scope},
        )
    assert rows == [{"note": "50% off: :today"}]


POSTGRES_ONLY = pytest.mark.parametrize(
    "store_kind", ["postgres-sync", "postgres-async"], indirect=True
)


@POSTGRES_ONLY
def test_postgres_casts_dollar_quotes_escape_strings_and_slices_keep_their_meaning(
    store: Any,
) -> None:
    with store.transaction() as tx:
        rows = tx.execute(
            "SELECT :n::int + 1 AS n, $$ :a 5% $$ AS dollar, $q$ $$ :a $q$ AS tagged,"
            " E'\\':a' AS escaped, (ARRAY[1, 2, 3])[2:3] AS slice, :a::text AS a,"
            " /* nested /* :a */ 5% */ 1 AS one",
            {"n": "41", "a": "x"},
        )
    assert rows == [
        {
            "n": 42,
            "dollar": " :a 5% ",
            "tagged": " $$ :a ",
            "escaped": "':a",
            "slice": [2, 3],
            "a": "x",
            "one": 1,
        }
    ]


@POSTGRES_ONLY
def test_psycopg_style_keeps_working_on_postgres_and_mixing_styles_is_refused(
    store: Any,
) -> None:
    with store.transaction() as tx:
        rows = tx.execute("SELECT %(a)s AS a, '100%%' AS p, 'x:y' AS c", {"a": "old"})
        assert rows == [{"a": "old", "p": "100%", "c": "x:y"}]
        with pytest.raises(MixedPlaceholders):
            tx.execute("SELECT :a, %(b)s", {"a": 1, "b": 2})
