"""The query files: they parse, the dialects agree, and every statement on the key
table is routable by scope (DESIGN 8).

No database here: this reads ``sql/{postgres,sqlite}/queries.sql`` as text. The scope
checker is a small depth-aware scanner, not a SQL parser; it is strict on purpose, so
a statement written in a shape it does not know is flagged, and the checker is taught
the new shape deliberately. Its strictness is proven below by mutating the real
statements and by a gallery of broken ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import resources

import pytest

from idempotence import _queries

DIALECTS = ["postgres", "sqlite"]
TABLE = "idempotency_keys"

#: How each dialect writes the scope parameter.
SCOPE_PARAM = {"postgres": "%(scope)s", "sqlite": ":scope"}

#: The one documented difference between the dialects' query sets: PostgreSQL claims
#: in one statement, SQLite in one write transaction of three (see queries.sql).
CLAIM_SHAPE = {
    # claim_held: the read that answers a request-as-transaction claim that would
    # wait for another open transaction (F8); SQLite's claim waits for the write lock.
    # claim_finished: the claim that writes the key finished (a fixed response, F3);
    # SQLite's claim then runs its finish, in the write lock it holds anyway.
    "postgres": {"claim", "claim_finished", "claim_held"},
    "sqlite": {"claim_read", "claim_insert", "claim_insert_finished", "claim_take_over"},
}

#: And PostgreSQL sends claims and finishes that queue up behind one in flight as one
#: statement each (DESIGN 11); SQLite has one writer at a time, with nothing to batch.
BATCH_SHAPE: dict[str, set[str]] = {"postgres": {"claim_batch", "finish_batch"}, "sqlite": set()}

#: The other documented difference: PostgreSQL wakes duplicates waiting for their twin
#: with LISTEN/NOTIFY (P10); SQLite's waits poll, with no query of their own.
WAKEUP_SHAPE: dict[str, set[str]] = {"postgres": {"mark_waiter", "listen"}, "sqlite": set()}

#: Queries that must exist and touch the key table, so the scope check cannot pass
#: vacuously (a renamed table or an emptied file would otherwise check nothing).
KEY_TABLE_OPERATIONS = {"checkpoint", "finish", "release", "heartbeat", "get"}


def query_text(dialect: str) -> str:
    return resources.files("idempotence").joinpath("sql", dialect, "queries.sql").read_text()


#: Maintenance scans that read across every scope by design (B1-B3, operator
#: listings), each marked `-- cross-scope: <why>` under its header. The set is pinned
#: here so a new cross-scope statement is a reviewed decision, never an accident.
CROSS_SCOPE = {
    "sweep_expired_locks",
    "pick_abandoned",
    "abandoned_unregistered",
    "expire_pending",
    "reap_finished",
    "list_keys",
    "key_stats",
}


def cross_scope(dialect: str) -> set[str]:
    """Queries marked `-- cross-scope: <why>` directly under their header."""
    return set(
        re.findall(r"^-- ([a-z_]+) --\n-- cross-scope: \S.*$", query_text(dialect), re.MULTILINE)
    )


def key_table_queries(dialect: str) -> dict[str, str]:
    """The dialect's named queries that mention the key table and serve one scope."""
    exempt = cross_scope(dialect)
    return {
        name: sql
        for name, sql in _queries.load(dialect).items()
        if re.search(rf"\b{TABLE}\b", sql, re.IGNORECASE) and name not in exempt
    }


@pytest.mark.parametrize("dialect", DIALECTS)
def test_d8_only_the_declared_maintenance_scans_cross_scopes(dialect: str) -> None:
    assert cross_scope(dialect) == CROSS_SCOPE


# -- the scope checker -------------------------------------------------------------------

_REFERENCE = re.compile(
    rf"\b(?P<verb>INSERT\s+INTO|UPDATE|FROM)\s+{TABLE}\b"
    r"(?:\s+(?:AS\s+)?(?P<alias>(?!(?:WHERE|SET|ON|USING|JOIN|LEFT|RIGHT|INNER|CROSS|"
    r"ORDER|GROUP|LIMIT|RETURNING|UNION|FOR)\b)[a-z_]\w*))?",
    re.IGNORECASE,
)
# Where a WHERE clause ends, at its own parenthesis depth.
_CLAUSE_END = re.compile(
    r"\b(?:RETURNING|ORDER\s+BY|GROUP\s+BY|HAVING|WINDOW|LIMIT|OFFSET|UNION|INTERSECT|EXCEPT"
    r"|FOR|ON\s+CONFLICT)\b",
    re.IGNORECASE,
)
_STATEMENT_END = re.compile(r"\b(?:RETURNING|UNION|INTERSECT|EXCEPT)\b", re.IGNORECASE)


def _mask(sql: str) -> str:
    """``sql`` with string literals and comments blanked, offsets unchanged."""

    def blank(match: re.Match[str]) -> str:
        text = match.group()
        if text.startswith("'"):
            return "'" + " " * (len(text) - 2) + "'"
        return " " * len(text)

    return re.sub(r"'(?:[^']|'')*'|--[^\n]*", blank, sql)


def _scan(text: str, start: int, stop: re.Pattern[str] | None) -> int:
    """The offset where the clause starting at ``start`` ends: the first ``stop`` at
    depth 0, a ``;`` at depth 0, the ``)`` closing an enclosing group, or the end."""
    depth, i = 0, start
    while i < len(text):
        char = text[i]
        if char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                return i
            depth -= 1
        elif depth == 0 and (
            char == ";" or (stop is not None and stop.match(text, i) and _word_start(text, i))
        ):
            return i
        i += 1
    return i


def _word_start(text: str, i: int) -> bool:
    return i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")


def _split_top_level(text: str, separator: re.Pattern[str]) -> list[str]:
    """Split ``text`` on ``separator`` where it occurs outside parentheses.

    An ``AND`` that closes a ``BETWEEN`` is not a separator.
    """
    parts, depth, last, i, between = [], 0, 0, 0, False
    while i < len(text):
        char = text[i]
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif depth == 0 and (_word_start(text, i) or not text[i].isalnum()):
            if re.match(r"BETWEEN\b", text[i:], re.IGNORECASE):
                between = True
            elif match := separator.match(text, i):
                if between and match.group().strip().upper() == "AND":
                    between = False
                else:
                    parts.append(text[last:i])
                    last = i = match.end()
                    continue
        i += 1
    parts.append(text[last:])
    return [" ".join(part.split()) for part in parts]


def _unwrap(text: str) -> str:
    """``text`` without parentheses that enclose all of it."""
    while text.startswith("(") and _scan(text, 1, None) == len(text) - 1:
        text = text[1:-1].strip()
    return text


def _group(text: str, i: int) -> tuple[str, int] | None:
    """The parenthesised group at ``text[i:]`` (after spaces): (its inside, end)."""
    match = re.compile(r"\s*\(").match(text, i)
    if not match:
        return None
    end = _scan(text, match.end(), None)
    return text[match.end() : end], end + 1


def _is_scope_predicate(conjunct: str, qualifiers: set[str], param: str) -> bool:
    match = re.fullmatch(
        r"(?:(?P<q>\w+)\.)?scope\s*=\s*" + re.escape(param) + r"(?:::\w+)?",
        _unwrap(conjunct),
        re.IGNORECASE,
    )
    if match is None:
        return False
    return match["q"] is None or match["q"].lower() in qualifiers


def _check_where(text: str, ref: re.Match[str], param: str) -> str | None:
    where = _scan(text, ref.end(), re.compile(r"WHERE\b|" + _STATEMENT_END.pattern, re.I))
    if not re.match(r"WHERE\b", text[where:], re.IGNORECASE):
        return "has no WHERE clause"
    end = _scan(text, where + len("WHERE"), _CLAUSE_END)
    conjuncts = _split_top_level(text[where + len("WHERE") : end], re.compile(r"AND\b", re.I))
    qualifiers = {TABLE, (ref["alias"] or TABLE).lower()}
    if not any(_is_scope_predicate(c, qualifiers, param) for c in conjuncts):
        return f"WHERE has no top-level conjunct `scope = {param}`: {conjuncts}"
    return None


def _check_insert(text: str, ref: re.Match[str], param: str) -> str | None:
    columns = _group(text, ref.end())
    values = re.compile(r"\s*VALUES\b", re.I).match(text, columns[1]) if columns else None
    select = re.compile(r"\s*SELECT\b", re.I).match(text, columns[1]) if columns else None
    if columns is None or (values is None and select is None):
        return (
            "is not INSERT INTO ... (columns) VALUES (...) or SELECT <values> "
            "(teach the checker this shape)"
        )
    names = [c.lower() for c in _split_top_level(columns[0], re.compile(r",", re.I))]
    if "scope" not in names:
        return "does not insert the scope column"
    if select is not None:
        # INSERT ... SELECT <values> [FROM <rows>] [WHERE ...]: the rows may come
        # from elsewhere (a batch's unnested parameters), but the scope inserted is
        # the parameter itself, never a value of those rows.
        end = _scan(text, select.end(), re.compile(r"WHERE\b|ON\s+CONFLICT\b|FROM\b", re.I))
        row_values = _split_top_level(text[select.end() : end], re.compile(r",", re.I))
        if len(row_values) != len(names):
            return f"selects {len(row_values)} values for {len(names)} columns"
        value = row_values[names.index("scope")]
        if not re.fullmatch(re.escape(param) + r"(?:::\w+)?", value):
            return f"inserts {value!r} as the scope, not {param}"
        return _check_conflict_target(text, end)
    position = values.end()
    while (row := _group(text, position)) is not None:
        row_values = _split_top_level(row[0], re.compile(r",", re.I))
        if len(row_values) != len(names):
            return f"has a row of {len(row_values)} values for {len(names)} columns"
        value = row_values[names.index("scope")]
        if not re.fullmatch(re.escape(param) + r"(?:::\w+)?", value):
            return f"inserts {value!r} as the scope, not {param}"
        position = row[1]
        comma = re.compile(r"\s*,").match(text, position)
        if not comma:
            break
        position = comma.end()
    return _check_conflict_target(text, position)


def _check_conflict_target(text: str, position: int) -> str | None:
    end = _scan(text, position, re.compile(r"ON\s+CONFLICT\b|" + _STATEMENT_END.pattern, re.I))
    conflict = re.compile(r"ON\s+CONFLICT\b", re.I).match(text, end)
    if conflict:
        target = _group(text, conflict.end())
        target_columns = (
            [c.lower() for c in _split_top_level(target[0], re.compile(r",", re.I))]
            if target
            else []
        )
        if "scope" not in target_columns:
            return "has an ON CONFLICT target that does not include scope"
    return None


def scope_violations(sql: str, param: str) -> list[str]:
    """Why ``sql`` is not routable by scope; empty when it is (DESIGN 8).

    Every reference to the key table must be one of: ``FROM``/``UPDATE`` with a WHERE
    clause that has ``scope = <param>`` as a top-level AND conjunct; or ``INSERT
    INTO (..., scope, ...) VALUES (..., <param>, ...)`` whose ``ON CONFLICT`` target,
    if any, includes ``scope``. Any other use of the table (a JOIN, a comma join,
    ``INSERT ... SELECT`` whose scope is not the parameter) is reported, so that a
    new shape is reviewed before it ships.
    """
    text = _mask(sql)
    problems, seen = [], set()
    for ref in _REFERENCE.finditer(text):
        seen.add(text.lower().index(TABLE, ref.start()))
        check = _check_insert if ref["verb"].upper().startswith("INSERT") else _check_where
        problem = check(text, ref, param)
        if problem:
            where = " ".join(sql[ref.start() : ref.start() + 60].split())
            problems.append(f"{where!r}...: {problem}")
    # A column qualified by the table's name (``idempotency_keys.scope``) is not a use.
    for use in re.finditer(rf"\b{TABLE}\b(?!\s*\.)", text, re.IGNORECASE):
        if use.start() not in seen:
            context = " ".join(sql[max(0, use.start() - 30) : use.end() + 30].split())
            problems.append(f"unrecognised use of {TABLE} in {context!r}")
    return problems


# -- DESIGN 8: every statement on the key table filters on scope -------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_d8_every_key_table_query_filters_on_scope(dialect: str) -> None:
    queries = key_table_queries(dialect)
    assert KEY_TABLE_OPERATIONS | CLAIM_SHAPE[dialect] | BATCH_SHAPE[dialect] <= set(queries)
    assert WAKEUP_SHAPE[dialect] - {"listen"} <= set(queries)
    problems = {
        name: found
        for name, sql in queries.items()
        if (found := scope_violations(sql, SCOPE_PARAM[dialect]))
    }
    assert problems == {}


def mutants(sql: str, param: str) -> Iterator[tuple[str, str]]:
    """Copies of ``sql`` with one scope filter broken each: (what was broken, text)."""
    predicate = re.compile(r"(?:\w+\.)?scope\s*=\s*" + re.escape(param))
    for n, match in enumerate(predicate.finditer(sql), 1):
        yield f"scope-filter-{n}-dropped", sql[: match.start()] + "TRUE" + sql[match.end() :]
        if re.match(r"\s+AND\b", sql[match.end() :]):
            ored = re.sub(r"^\s+AND\b", " OR", sql[match.end() :])
            yield f"scope-filter-{n}-ored", sql[: match.end()] + ored
    conflict = re.compile(r"(ON\s+CONFLICT\s*\()\s*scope\s*,\s*")
    if conflict.search(sql):
        yield "conflict-target-without-scope", conflict.sub(r"\1", sql)
    insert = re.compile(rf"(INSERT\s+INTO\s+{TABLE}(?:\s+AS\s+\w+)?\s*\(\s*)scope\s*,\s*")
    if insert.search(sql):
        without_column = insert.sub(r"\1", sql)
        yield (
            "insert-without-scope",
            re.sub(r"(VALUES\s*\(\s*)" + re.escape(param) + r"\s*,\s*", r"\1", without_column),
        )


MUTANTS = [
    pytest.param(dialect, sql, id=f"{dialect}-{name}-{label}")
    for dialect in DIALECTS
    for name, original in key_table_queries(dialect).items()
    for label, sql in mutants(original, SCOPE_PARAM[dialect])
]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_d8_every_key_table_query_has_a_mutant(dialect: str) -> None:
    """Each statement's scope filter is in a form the mutants below can break, so the
    checker's strictness is proven for every one of them."""
    param = SCOPE_PARAM[dialect]
    untested = [
        name for name, sql in key_table_queries(dialect).items() if not list(mutants(sql, param))
    ]
    assert untested == []


@pytest.mark.parametrize(("dialect", "sql"), MUTANTS)
def test_d8_checker_flags_a_query_whose_scope_filter_is_broken(dialect: str, sql: str) -> None:
    assert scope_violations(sql, SCOPE_PARAM[dialect])


BROKEN = {
    "delete-without-scope": "DELETE FROM idempotency_keys WHERE expires_at < now()",
    "update-without-where": "UPDATE idempotency_keys SET locked_at = NULL",
    "scope-in-an-or": "SELECT * FROM idempotency_keys WHERE scope = {p} OR key = :key",
    "scope-or-true": "UPDATE idempotency_keys SET a = 1 WHERE (scope = {p} OR TRUE) AND id = 1",
    "scope-of-another-table": "SELECT * FROM idempotency_keys AS k WHERE o.scope = {p}",
    "scope-from-another-param": "SELECT * FROM idempotency_keys WHERE scope = :tenant",
    "scope-only-in-subquery": (
        "SELECT * FROM idempotency_keys WHERE id IN "
        "(SELECT id FROM idempotency_keys WHERE scope = {p})"
    ),
    "scope-only-in-returning": "UPDATE idempotency_keys SET a = 1 RETURNING scope = {p}",
    "join": "SELECT * FROM rides JOIN idempotency_keys k ON k.id = rides.key_id",
    "comma-join": "SELECT * FROM rides, idempotency_keys WHERE rides.scope = {p}",
    "insert-without-scope": "INSERT INTO idempotency_keys (key) VALUES (:key)",
    "insert-scope-from-elsewhere": "INSERT INTO idempotency_keys (scope, key) VALUES (:key, {p})",
    "insert-second-row-unscoped": (
        "INSERT INTO idempotency_keys (scope, key) VALUES ({p}, :a), ('other', :b)"
    ),
    "insert-select": "INSERT INTO idempotency_keys (scope, key) SELECT scope, key FROM old",
    "insert-select-scope-from-elsewhere": (
        "INSERT INTO idempotency_keys (scope, key) SELECT :key, {p} WHERE true"
    ),
    "insert-select-conflict-on-key-only": (
        "INSERT INTO idempotency_keys (scope, key) SELECT {p}, :key ON CONFLICT (key) DO NOTHING"
    ),
    "conflict-without-target": (
        "INSERT INTO idempotency_keys (scope, key) VALUES ({p}, :key) ON CONFLICT DO NOTHING"
    ),
    "conflict-on-key-only": (
        "INSERT INTO idempotency_keys (scope, key) VALUES ({p}, :key) ON CONFLICT (key) DO NOTHING"
    ),
}

SCOPED = {
    "between": "SELECT * FROM idempotency_keys WHERE key BETWEEN :a AND :b AND (scope = {p})",
    "alias": "DELETE FROM idempotency_keys k WHERE k.scope = {p} AND k.expires_at < now()",
    "table-qualified": "SELECT 1 FROM idempotency_keys WHERE idempotency_keys.scope = {p}",
    "insert": "INSERT INTO idempotency_keys (key, scope) VALUES (:key, {p}) RETURNING id",
    "insert-select-one-row": (
        "INSERT INTO idempotency_keys (scope, key) SELECT {p}, :key WHERE NOT EXISTS "
        "(SELECT FROM settled) ON CONFLICT (scope, key) DO NOTHING RETURNING id"
    ),
    "name-in-a-string": "SELECT 'FROM idempotency_keys' AS note",
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("sql", BROKEN.values(), ids=BROKEN.keys())
def test_d8_checker_flags_unscoped_statements(dialect: str, sql: str) -> None:
    param = SCOPE_PARAM[dialect]
    assert scope_violations(sql.format(p=param), param)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("sql", SCOPED.values(), ids=SCOPED.keys())
def test_d8_checker_accepts_scoped_statements(dialect: str, sql: str) -> None:
    param = SCOPE_PARAM[dialect]
    assert scope_violations(sql.format(p=param), param) == []


# -- the files parse --------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_query_file_names_are_unique_and_statements_non_empty(dialect: str) -> None:
    text = query_text(dialect)
    names = re.findall(r"^-- ([a-z_]+) --$", text, re.MULTILINE)
    assert len(names) == len(set(names)), "a query name is used twice"
    queries = _queries.load(dialect)
    assert list(queries) == names
    assert [name for name, sql in queries.items() if not sql.strip()] == []


@pytest.mark.parametrize("dialect", DIALECTS)
def test_query_file_hides_no_statement_from_the_parser(dialect: str) -> None:
    """The parser drops the text before the first header and keeps a misspelt header
    as a comment of the previous query: neither may hold anything but comments."""
    text = query_text(dialect)
    first_header = re.search(r"^-- [a-z_]+ --$", text, re.MULTILINE)
    assert first_header is not None
    preamble = text[: first_header.start()]
    assert [
        line for line in preamble.splitlines() if not line.startswith("--") and line.strip()
    ] == []
    header_like = re.findall(r"^--\s*[\w-]+\s*--\s*$", text, re.MULTILINE)
    assert [line for line in header_like if not re.fullmatch(r"-- [a-z_]+ --", line)] == []


def test_parse_strips_comments_and_the_final_semicolon() -> None:
    text = "-- preamble\n\n-- one --\n-- What it does.\nSELECT 1;\n\n-- two --\nSELECT\n  2\n"
    assert _queries.parse(text) == {"one": "SELECT 1", "two": "SELECT\n  2"}


def test_parse_rejects_a_duplicate_name() -> None:
    with pytest.raises(ValueError, match="'one' is defined twice"):
        _queries.parse("-- one --\nSELECT 1;\n-- two --\nSELECT 2;\n-- one --\nSELECT 3;\n")


# -- the dialects agree ---------------------------------------------------------------


def test_dialects_define_the_same_queries_but_the_claims_and_wakeups_shape() -> None:
    postgres, sqlite = set(_queries.load("postgres")), set(_queries.load("sqlite"))
    assert CLAIM_SHAPE["postgres"] | WAKEUP_SHAPE["postgres"] <= postgres
    assert CLAIM_SHAPE["sqlite"] | WAKEUP_SHAPE["sqlite"] <= sqlite
    assert BATCH_SHAPE["postgres"] <= postgres
    shared = postgres - CLAIM_SHAPE["postgres"] - WAKEUP_SHAPE["postgres"] - BATCH_SHAPE["postgres"]
    assert shared == sqlite - CLAIM_SHAPE["sqlite"] - WAKEUP_SHAPE["sqlite"]


def test_each_dialect_runs_its_claim_in_the_shape_its_queries_have() -> None:
    from idempotence.stores.postgres import PostgresDialect
    from idempotence.stores.sqlite import SqliteDialect

    assert PostgresDialect.claim_is_one_statement
    assert not SqliteDialect.claim_is_one_statement


def _normalized(sql: str) -> str:
    # A parameter and the batch's column of it read alike (%(status)s, i.status), and
    # a row's alias (k.) is dropped: what is left is what the statement does.
    sql = re.sub(r"%\((\w+)\)s", r"\1", sql)
    sql = re.sub(r"\b[ik]\.", "", sql)
    return " ".join(sql.split())


def _between(sql: str, start: str, end: str) -> str:
    begin = sql.index(start)
    return sql[begin : sql.index(end, begin)]


@pytest.mark.parametrize(
    ("single", "batch", "start", "ends"),
    [
        ("claim", "claim_batch", "ON CONFLICT", ("RETURNING", "RETURNING")),
        # The finish's SET list ends where its WHERE (single) or FROM (batch) begins.
        ("finish", "finish_batch", "SET recovery_point", ("\nWHERE", "\nFROM")),
    ],
)
def test_d11_a_batch_statement_decides_as_its_single_statement(
    single: str, batch: str, start: str, ends: tuple[str, str]
) -> None:
    """Natural batching (DESIGN 11) gives each caller what its own statement would
    have: the batch's takeover rule (P5) and the finish's writes must be the single
    statement's, word for word, so that one cannot change without the other."""
    queries = _queries.load("postgres")
    alone = _between(queries[single], start, ends[0])
    batched = _between(queries[batch], start, ends[1])
    assert len(alone) > 100 and _normalized(batched) == _normalized(alone)


def test_f3_the_claim_that_finishes_decides_as_the_claim_and_writes_what_finish_writes() -> None:
    """claim_finished (a transactional consumer's claim) is the claim with finish's
    writes: its snapshot test, takeover rule (P5) and answer must stay the claim's word
    for word, and it must set every column finish sets, so that neither can change
    without the other."""
    queries = _queries.load("postgres")
    claim, finished, finish = queries["claim"], queries["claim_finished"], queries["finish"]
    for start, end in (("WITH settled", "claimed AS"), ("WHERE k.fingerprint", "RETURNING")):
        assert _between(finished, start, end) == _between(claim, start, end)
    answer = claim[claim.index("RETURNING k.*") :]
    assert len(answer) > 100 and finished.endswith(answer)
    assigned = re.compile(r"^\s*(?:SET\s+)?(\w+) =", re.MULTILINE)
    finish_writes = set(assigned.findall(_between(finish, "SET", "\nWHERE")))
    takeover_writes = set(assigned.findall(_between(finished, "DO UPDATE", "WHERE k.")))
    assert len(finish_writes) >= 10 and finish_writes <= takeover_writes
