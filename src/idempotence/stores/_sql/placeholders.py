"""One placeholder style for the application's SQL on every store: ``:name``.

sqlite3 takes ``:name`` as written; psycopg wants ``%(name)s``.
[`to_pyformat`][idempotence.stores.sql.to_pyformat] rewrites a statement's ``:name``
placeholders for psycopg, reading the SQL the way PostgreSQL's lexer does, so that
nothing but a placeholder is touched:

* ``'string literals'`` (``''`` inside), ``E'escape strings'`` (``\\'`` inside),
  ``"quoted identifiers"``, ``$tag$dollar-quoted bodies$tag$``, ``-- line`` and
  ``/* nested block */`` comments are copied as they are;
* ``::type`` is a cast, not a placeholder (``:amount::numeric`` is one of each);
* a colon right after a letter, digit, underscore or colon is not one either, so an
  array slice ``a[lo:hi]`` keeps its meaning;
* once a statement has a ``:name`` placeholder, psycopg reads every ``%`` in it
  (literals included) as the start of one of its own, so each ``%`` is doubled.

A statement without ``:name`` placeholders is returned unchanged: psycopg's own
``%(name)s`` and ``%s`` keep working. One that mixes the two styles is refused with
[`MixedPlaceholders`][idempotence.errors.MixedPlaceholders]. Translations are cached per SQL text,
so a statement an application runs on every request is scanned once.

```python
to_pyformat("SELECT :amount::numeric, ':not', '5%' WHERE a[lo:hi] = :x")
# "SELECT %(amount)s::numeric, ':not', '5%%' WHERE a[lo:hi] = %(x)s"
to_pyformat("SELECT %(amount)s")
# 'SELECT %(amount)s'
```
"""

from __future__ import annotations

import functools
import re

from ...errors import MixedPlaceholders

__all__ = ["to_pyformat"]

# The lexical elements a placeholder can never be inside, and the placeholders; one
# alternation, tried left to right at each position (re.finditer never overlaps).
_TOKENS = re.compile(
    r"""
      (?P<string>  (?<![\w$])[Ee]'(?:[^'\\]|\\.|'')*'   # E'...' escape string
                 | '(?:[^']|'')*'                        # '...' standard string
                 | "(?:[^"]|"")*" )                      # "quoted identifier"
    | (?P<dollar>  (?<![\w$])\$(?P<tag>[A-Za-z_][\w]*)?\$ )
    | (?P<comment> --[^\n]* | /\* )
    | (?P<cast>    ::+ )
    | (?P<named>   (?<![\w:]):(?P<name>[A-Za-z_]\w*) )
    | (?P<pyformat> %(?:\([^)]*\))?[sbt] )
    | (?P<percent> % )
    """,
    re.VERBOSE | re.DOTALL,
)
_BLOCK = re.compile(r"/\*|\*/")


def _block_comment_end(sql: str, start: int) -> int:
    """The position just past the block comment opened at ``start`` (they nest)."""
    depth = 0
    for mark in _BLOCK.finditer(sql, start):
        depth += 1 if mark.group() == "/*" else -1
        if depth == 0:
            return mark.end()
    return len(sql)


@functools.lru_cache(maxsize=2048)
def to_pyformat(sql: str) -> str:
    """``sql`` with its ``:name`` placeholders written as psycopg's ``%(name)s``."""
    out: list[str] = []
    named = pyformat = False
    position = 0
    while (token := _TOKENS.search(sql, position)) is not None:
        out.append(sql[position : token.start()])
        kind = token.lastgroup if token.lastgroup != "tag" else "dollar"
        end = token.end()
        if kind == "dollar":
            closing = sql.find(token.group(), end)
            end = len(sql) if closing < 0 else closing + len(token.group())
        elif kind == "comment" and token.group() == "/*":
            end = _block_comment_end(sql, token.start())
        text = sql[token.start() : end]
        if kind == "named":
            named = True
            out.append(f"%({token.group('name')})s")
        elif kind == "pyformat":
            pyformat = True
            out.append(text)
        else:
            # A literal, a comment, a cast or a lone %: kept, with every % marked so
            # it can be doubled should the statement turn out to use :name.
            out.append(text.replace("%", "\0"))
        position = end
    out.append(sql[position:].replace("%", "\0"))
    if not named:
        return sql
    if pyformat:
        raise MixedPlaceholders(
            f"this statement mixes :name and psycopg's %(name)s or %s placeholders: {sql!r};"
            " write every parameter as :name (a literal % then needs no doubling)"
        )
    return "".join(out).replace("\0", "%%")
