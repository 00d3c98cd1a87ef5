"""``:name`` on every SQL store: the translation to psycopg's ``%(name)s`` (no database).

Each case is SQL that a naive search-and-replace gets wrong: a colon or a percent sign
inside a string literal, a quoted identifier, a comment or a dollar-quoted body, a
``::`` cast, an array slice. ``tests/test_placeholders.py`` runs the same statements
on real PostgreSQL and SQLite.
"""

from __future__ import annotations

import pytest

from idempotence.errors import ConfigurationError, MixedPlaceholders
from idempotence.stores import to_pyformat


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT :a", "SELECT %(a)s"),
        ("VALUES (:account, :amount)", "VALUES (%(account)s, %(amount)s)"),
        # A cast is not a placeholder; a placeholder followed by a cast is one of each.
        ("SELECT :a::numeric, x::text", "SELECT %(a)s::numeric, x::text"),
        # Literals keep their colons; every % is doubled, because psycopg reads them all.
        ("SELECT ':x', '100%', :y", "SELECT ':x', '100%%', %(y)s"),
        ("SELECT 'it''s :x', :y", "SELECT 'it''s :x', %(y)s"),
        ("SELECT E'it\\'s :x', :y", "SELECT E'it\\'s :x', %(y)s"),
        ('SELECT "col:x", :y', 'SELECT "col:x", %(y)s'),
        ("SELECT $$ :x % $$, :y", "SELECT $$ :x %% $$, %(y)s"),
        ("SELECT $fn$ $$ :x $fn$, :y", "SELECT $fn$ $$ :x $fn$, %(y)s"),
        ("SELECT :y -- :x 5%\n", "SELECT %(y)s -- :x 5%%\n"),
        ("/* :x /* :z */ :w */ SELECT :y", "/* :x /* :z */ :w */ SELECT %(y)s"),
        # An array slice after a name or a number is not a placeholder.
        ("SELECT a[lo:hi], a[1:n], :y", "SELECT a[lo:hi], a[1:n], %(y)s"),
        ("SELECT 7 % 3, :y", "SELECT 7 %% 3, %(y)s"),
        ("SELECT $1, :y", "SELECT $1, %(y)s"),
    ],
)
def test_named_placeholders_become_pyformat_and_nothing_else_changes(
    sql: str, expected: str
) -> None:
    assert to_pyformat(sql) == expected


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT %(a)s, '100%%'",  # psycopg's own style, as existing users write it
        "SELECT %s, %b",
        "SELECT ':x', '5%', x::int, a[1:n] -- :c",  # no placeholder at all
        "CREATE TABLE t (id int)",
    ],
)
def test_a_statement_without_named_placeholders_is_returned_unchanged(sql: str) -> None:
    assert to_pyformat(sql) is sql


def test_mixing_the_two_styles_is_refused_with_a_message_that_says_what_to_write() -> None:
    with pytest.raises(MixedPlaceholders, match=r"write every parameter as :name"):
        to_pyformat("SELECT :a, %(b)s")
    assert issubclass(MixedPlaceholders, ConfigurationError)
    # A %(b)s inside a literal is text, not a placeholder: no mix.
    assert to_pyformat("SELECT :a, '%(b)s'") == "SELECT %(a)s, '%%(b)s'"


def test_the_translation_is_cached_per_sql_text() -> None:
    sql = "SELECT :cached_once"
    first = to_pyformat(sql)
    hits = to_pyformat.cache_info().hits
    assert to_pyformat(sql) is first
    assert to_pyformat.cache_info().hits == hits + 1
