"""Every example's imports are installed by the extras its section names.

A reader installs what a guide says (``pip install -e '.[fastapi]'``) and pastes its
example: each Python block of README.md and the documentation pages names its extras in
an ``<!-- extras: NAME, ... -->`` comment (none: the package alone), and every module it
imports must come with them. The extras are read from pyproject.toml (what the package
ships) and each third-party requirement is followed through the installed packages'
own metadata, so ``fastapi`` provides ``pydantic`` and ``starlette`` too.
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import tomllib
from functools import cache

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.docs.blocks import ROOT, Block, all_blocks

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
NAME = canonicalize_name(PROJECT["name"])
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]
PYTHON_BLOCKS = [block for block in all_blocks() if block.language == "python"]


def _requirements_of(distribution: str, extras: frozenset[str]) -> list[Requirement]:
    """What ``distribution`` installs with ``extras``, in this environment."""
    if canonicalize_name(distribution) == NAME:
        texts = list(PROJECT["dependencies"])
        for extra in extras:
            texts += EXTRAS[extra]
        return [Requirement(text) for text in texts]
    try:
        texts = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return []  # not installed here: nothing known beyond its name
    found = []
    for text in texts:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": e}) for e in {"", *extras}):
            found.append(requirement)
    return found


@cache
def provided(extras: frozenset[str]) -> frozenset[str]:
    """The distributions installed by ``pip install 'idempotence[extras]'``."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(NAME, extras)]
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        for requirement in _requirements_of(name, wanted):
            todo.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return frozenset(name for name, _ in seen)


def imported(code: str) -> set[str]:
    """The top-level modules a block imports, leaving out the standard library and
    this package."""
    modules = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "idempotence"}


@cache
def _distributions() -> dict[str, list[str]]:
    # Reads every installed distribution's file list (most of a second): once a run.
    return dict(importlib.metadata.packages_distributions())


def missing(block: Block) -> dict[str, list[str]]:
    """Each module of ``block`` that its extras do not install, with the distributions
    that would provide it."""
    distributions = _distributions()
    have = provided(frozenset(block.extras))
    gaps = {}
    for module in sorted(imported(block.code)):
        candidates = distributions.get(module, [module])
        if not {canonicalize_name(name) for name in candidates} & have:
            gaps[module] = candidates
    return gaps


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[block.id for block in PYTHON_BLOCKS])
def test_the_extras_its_section_names_install_what_the_example_imports(block: Block) -> None:
    unknown = [extra for extra in block.extras if extra not in EXTRAS]
    assert not unknown, f"{block.id} names extras the package does not have: {unknown}"
    gaps = missing(block)
    assert not gaps, (
        f"{block.id} imports {sorted(gaps)}, which `pip install -e '.[{','.join(block.extras)}]'`"
        f" does not install: name the extra that does in its <!-- extras: ... --> comment,"
        f" or add the package to that extra in pyproject.toml ({gaps})"
    )


def test_the_checker_follows_requirements_and_catches_a_missing_extra() -> None:
    assert {"fastapi", "pydantic", "starlette", "uvicorn"} <= provided(frozenset({"fastapi"}))
    assert "fastapi" not in provided(frozenset({"flask"}))
    block = Block(ROOT / "README.md", 1, "python", "from fastapi import FastAPI\n", None, "")
    assert missing(block) == {"fastapi": ["fastapi"]}
    assert missing(Block(ROOT, 1, "python", "import os\nimport idempotence\n", None, "")) == {}
    assert imported("from . import x\nimport a.b\nfrom c.d import e\n") == {"a", "c"}
