"""No module under ``src/`` is over 600 lines, and no function in it over 80.

A reader holds a module or a function in one sitting; past these sizes it is usually
holding two things that want their own names (STYLE: "split by responsibility, not by
size", so a failure here asks for a seam, not for squeezed lines). Generated modules
(first line ``# Generated from ...``) are left out: their size is their source's.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _hand_written() -> list[Path]:
    return sorted(
        path for path in SRC.rglob("*.py") if not path.read_text().startswith("# Generated from")
    )


def _name(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def test_sources_are_found() -> None:
    # Guard against a moved src/ turning the tests below into checks of nothing.
    assert len(_hand_written()) > 20


def test_no_module_over_600_lines() -> None:
    offenders = [
        f"{_name(path)}: {lines} lines"
        for path in _hand_written()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not offenders, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(offenders)


def test_no_function_over_80_lines() -> None:
    offenders = []
    for path in _hand_written():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    offenders.append(f"{_name(path)}:{node.lineno} {node.name}: {lines} lines")
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)
