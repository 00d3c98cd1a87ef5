"""docs/design.md defines every requirement number the code and the tests cite.

Code and tests name the contract's requirements (``# P3``, ``(F1)``, ``test_r5_...``,
``DESIGN 4`` for a section) so that a reader can look them up. These tests hold the
design document to that: each number cited anywhere in ``src/`` or ``tests/`` is
defined in it, as a heading (``### P6 ...``) or as the first cell of a table row
(``| P1 | ...``), and no number is defined twice.

Numbers are collected from prose only, never from code: comments and string literals
(docstrings, error messages) of Python files, ``--`` comments of SQL files, and test
names (``test_p3_...``, ``test_b1_p10_...``). A number is one of the contract's
letters, then 1 to 99 without a leading zero, as a whole word: so ``F401`` (a lint
code), ``0xF1`` (hex) and ``PLR2004`` never count.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "design.md"
THIS_FILE = Path(__file__).resolve()

NUMBER = re.compile(r"(?<!\w)([PRFBM][1-9][0-9]?)(?!\w)")
TEST_NAME = re.compile(r"^test_((?:[prfbm][1-9][0-9]?_)+)")
SECTION = re.compile(r"\bDESIGN (\d+)\b")
SQL_COMMENT = re.compile(r"--(.*)$", re.MULTILINE)
#: A definition: a heading or a table row that starts with the number.
DEFINITION = re.compile(r"^(?:#{2,6}[ \t]+|\|[ \t]*)([PRFBM][1-9][0-9]?)(?!\w)", re.MULTILINE)
DOC_SECTION = re.compile(r"^## (\d+)\. ", re.MULTILINE)

#: Every requirement of the contract, built or not: the document must define them all.
CONTRACT = {
    *(f"P{n}" for n in range(1, 12)),
    *(f"R{n}" for n in range(1, 8)),
    *(f"F{n}" for n in range(1, 9)),
    *(f"B{n}" for n in range(1, 6)),
    *(f"M{n}" for n in range(1, 5)),
}


def python_prose(source: str) -> list[str]:
    """The comments, string literals and test names of a Python source."""
    texts: list[str] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            texts.append(token.string)
        elif token.type == tokenize.NAME and (name := TEST_NAME.match(token.string)):
            texts.append(name.group(1).replace("_", " ").upper())
    return texts


def sql_prose(source: str) -> list[str]:
    return SQL_COMMENT.findall(source)


def prose_by_file() -> dict[Path, list[str]]:
    files: dict[Path, list[str]] = {}
    for top in ("src", "tests"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.resolve() == THIS_FILE:
                continue  # its examples are not citations
            if path.suffix == ".py":
                files[path] = python_prose(path.read_text(encoding="utf-8"))
            elif path.suffix == ".sql":
                files[path] = sql_prose(path.read_text(encoding="utf-8"))
    return files


def cited(pattern: re.Pattern[str]) -> dict[str, set[str]]:
    """Each number ``pattern`` finds in the prose, with the files that cite it."""
    where: dict[str, set[str]] = {}
    for path, texts in prose_by_file().items():
        for text in texts:
            for number in pattern.findall(text):
                where.setdefault(number, set()).add(str(path.relative_to(ROOT)))
    return where


def definitions(doc: str) -> list[str]:
    return DEFINITION.findall(doc)


def undefined(citations: dict[str, set[str]], doc: str) -> dict[str, set[str]]:
    defined = set(definitions(doc))
    return {number: files for number, files in citations.items() if number not in defined}


def test_every_cited_requirement_is_defined_in_the_design_doc() -> None:
    citations = cited(NUMBER)
    assert len(citations) >= 20, "the scan found almost no citations: is it still working?"
    missing = undefined(citations, DOC.read_text(encoding="utf-8"))
    assert not missing, "cited but not defined in docs/design.md: " + "; ".join(
        f"{number} (in {', '.join(sorted(files)[:3])})" for number, files in sorted(missing.items())
    )


def test_every_requirement_is_defined_once() -> None:
    counts = Counter(definitions(DOC.read_text(encoding="utf-8")))
    twice = sorted(number for number, count in counts.items() if count > 1)
    assert not twice, f"defined more than once in docs/design.md: {twice}"


def test_every_requirement_of_the_contract_is_defined_built_or_not() -> None:
    defined = set(definitions(DOC.read_text(encoding="utf-8")))
    assert CONTRACT - defined == set()
    assert defined - CONTRACT == set(), "a number the contract does not have"


def test_every_cited_section_is_a_section_of_the_design_doc() -> None:
    sections = set(DOC_SECTION.findall(DOC.read_text(encoding="utf-8")))
    missing = {n: files for n, files in cited(SECTION).items() if n not in sections}
    assert not missing, f"DESIGN <n> cited but no section '## <n>.' in docs/design.md: {missing}"


# -- the checker itself ------------------------------------------------------------------


def test_the_checker_finds_a_number_missing_from_the_doc() -> None:
    doc = DOC.read_text(encoding="utf-8")
    citations = {"P6": {"x.py"}, "F1": {"y.py"}}
    assert undefined(citations, doc) == {}
    without_p6 = "\n".join(line for line in doc.splitlines() if not line.startswith("### P6"))
    assert undefined(citations, without_p6) == {"P6": {"x.py"}}
    without_p1 = "\n".join(line for line in doc.splitlines() if not line.startswith("| P1 |"))
    assert "P1" not in definitions(without_p1)


def test_the_checker_counts_prose_and_test_names_not_code() -> None:
    source = (
        "import os  # noqa: F401\n"
        "R2 = 0xF1 + 2\n"
        "# P3: a replay\n"
        "def test_b1_p10_wakes() -> None:\n"
        '    """Takes over (P5), fenced (F1-F2)."""\n'
        '    raise ValueError("refused (F3)")\n'
    )
    found = {n for text in python_prose(source) for n in NUMBER.findall(text)}
    assert found == {"P3", "B1", "P10", "P5", "F1", "F2", "F3"}
    assert NUMBER.findall(" ".join(sql_prose("SELECT 'R7' -- B4: the enqueuer\n"))) == ["B4"]


def test_a_mention_is_not_a_definition() -> None:
    doc = "## 4. The claim\n\n| # | row |\n|---|---|\n| P1 | none |\n\nSee P2 and | x | P3 |\n"
    assert definitions(doc) == ["P1"]


# -- the pointers stay current -----------------------------------------------------------

#: A file or folder the doc names: a test path, or a path of the package, the scripts or
#: the benchmarks (``stores/_ops.py``, ``flows/``, ``contrib/django_app``).
POINTER = re.compile(
    r"`((?:tests|scripts|benchmarks)/[\w./-]*|[\w/-]+\.(?:py|sql|lua)|[a-z_]+/(?:[\w/-]*/)?)`"
)


def pointers(doc: str) -> set[str]:
    return set(POINTER.findall(doc))


def stale(doc: str) -> list[str]:
    """The pointers of ``doc`` that name nothing in the repository."""
    roots = (ROOT, ROOT / "src" / "idempotence", ROOT / "src")
    return sorted(p for p in pointers(doc) if not any((r / p).exists() for r in roots))


def test_every_file_the_design_doc_points_to_exists() -> None:
    doc = DOC.read_text(encoding="utf-8")
    assert len(pointers(doc)) > 50, "the scan found almost no pointers: is it still working?"
    assert stale(doc) == [], "docs/design.md names files that do not exist (moved?)"


def test_every_requirement_names_the_tests_that_hold_it() -> None:
    doc = DOC.read_text(encoding="utf-8")
    blocks = re.split(r"^(?=### |\| [PRFBM]\d)", doc, flags=re.MULTILINE)
    untested = [
        number
        for block in blocks
        if (number := next(iter(definitions(block)), None))
        and "tests/" not in block.split("\n### ")[0]
    ]
    assert untested == []


def test_the_pointer_check_finds_a_moved_file() -> None:
    assert stale("`states.py`, `tests/unit/`, `flows/`") == []
    assert stale("`stores/_gone.py` and `tests/nowhere/`") == ["stores/_gone.py", "tests/nowhere/"]
