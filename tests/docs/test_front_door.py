"""The README is a front door, and the pages a newcomer reads speak the user's words.

Requirement numbers (P1, F3, ...) name the design contract's promises for the code and
its tests; a reader of the README, a tutorial or a how-to guide is told what happens
instead. docs/design.md defines them, and the explanation pages that accompany it may
cite them.
"""

from __future__ import annotations

import ast
import re

from tests.docs.blocks import ROOT

README_MAX_LINES = 250
NUMBER = re.compile(r"(?<![\w-])[PRFBM][1-9][0-9]?(?![\w-])")
USER_FACING = [
    ROOT / "README.md",
    ROOT / "docs" / "index.md",
    *sorted((ROOT / "docs" / "tutorials").glob("*.md")),
    *sorted((ROOT / "docs" / "how-to").glob("*.md")),
]


def numbers_in(text: str) -> list[str]:
    return NUMBER.findall(text)


def test_the_readme_reads_in_five_minutes() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail to docs/"


def test_the_readme_tutorials_and_guides_cite_no_requirement_numbers() -> None:
    found = {
        str(page.relative_to(ROOT)): numbers_in(page.read_text(encoding="utf-8"))
        for page in USER_FACING
    }
    assert len(found) > 10, sorted(found)
    assert {page: numbers for page, numbers in found.items() if numbers} == {}


def test_the_readme_links_to_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert len(local) > 10
    assert [link for link in local if not (ROOT / link).exists()] == []


def test_the_checker_finds_a_number_and_leaves_other_words() -> None:
    assert numbers_in("a twin gets 409 (P4); fenced (F1), R2-D2, MP3, F401, B0") == [
        "P4",
        "F1",
    ]


def curl_commands_without_json(text: str) -> list[str]:
    """The curl commands in ``text`` that send a JSON body without saying it is JSON:
    curl's ``-d`` labels it a form, which a JSON endpoint answers with 422 before any
    idempotency happens, so a reader pasting the command sees the example fail. (A
    form body, as the demo's API also takes, is left alone.)"""
    joined = text.replace("\\\n", " ")
    commands = [line.strip().removeprefix("$ ") for line in joined.splitlines()]
    return [
        command
        for command in commands
        if command.startswith("curl ")
        and re.search(r"\s(-d|--data)\s+'[{\[]", command)
        and not re.search(r"content-type:\s*application/json|\s--json\s", command, re.I)
    ]


def test_every_curl_with_a_body_sends_it_as_json() -> None:
    found = {
        str(page.relative_to(ROOT)): curl_commands_without_json(page.read_text(encoding="utf-8"))
        for page in USER_FACING
    }
    assert {page: commands for page, commands in found.items() if commands} == {}


def test_the_curl_checker_tells_a_form_from_json() -> None:
    form = "$ curl -i localhost:8000/charges -H 'Idempotency-Key: k' -d '{\"amount\": 1}'"
    json_body = "curl -si x -H 'k: 1' \\\n  -H 'Content-Type: application/json' -d '{}'"
    assert curl_commands_without_json(form) == [form.removeprefix("$ ")]
    assert curl_commands_without_json(json_body) == []
    assert curl_commands_without_json("curl -s x -H 'k: 1'") == []
    assert curl_commands_without_json("curl -s x -d 'a=1&b=2'") == []


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings (of a module, class or function,
    or an attribute's, the string after an assignment): the reference renders them, and
    they may cite the contract; every other string is a message, a log line or a help
    text that a user reads."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for before, after in zip([None, *body], body, strict=False):
            if not (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)):
                continue
            if before is None or isinstance(before, ast.Assign | ast.AnnAssign):
                found.add(id(after.value))
    return found


def numbers_in_messages(source: str) -> list[str]:
    """The requirement numbers in ``source``'s strings other than its docstrings."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    return [
        number
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
        for number in numbers_in(node.value)
    ]


def test_error_messages_logs_and_help_texts_cite_no_requirement_numbers() -> None:
    modules = sorted((ROOT / "src").rglob("*.py"))
    assert len(modules) > 100
    found = {
        str(module.relative_to(ROOT)): numbers_in_messages(module.read_text(encoding="utf-8"))
        for module in modules
    }
    assert {module: numbers for module, numbers in found.items() if numbers} == {}


def test_the_message_checker_reads_messages_and_leaves_docstrings_and_comments() -> None:
    source = (
        '"""Module (P1)."""\n'
        "LIMIT = 3\n"
        '"""An attribute (P2)."""\n'
        "def f():\n"
        '    """A function (F3)."""\n'
        "    # a comment (R4)\n"
        '    raise ValueError("fenced (F1)")\n'
    )
    assert numbers_in_messages(source) == ["F1"]
