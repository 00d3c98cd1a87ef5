"""The package's modules import each other without a cycle (a house a newcomer can
read: each module can be understood from the ones below it).

Every import counts, including those under ``if TYPE_CHECKING:`` and inside functions:
a cycle that only type checking or a lazy import hides is still a cycle for the reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import idempotence

PACKAGE = Path(idempotence.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in known else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    # The check above can fail: a hidden (type-checking only) edge back closes a loop.
    graph = import_graph()
    graph["idempotence.states"] = graph["idempotence.states"] | {"idempotence.flows.flow"}
    assert any("idempotence.states" in cycle for cycle in cycles(graph))
    assert "idempotence.flows.flow" in graph and "idempotence.observability" in graph


def test_the_library_never_imports_the_demo():
    """Rocket Rides is a package beside the library (``rocket_rides``); the CLI loads it
    by name when ``idempotence demo`` runs, so no module of the library imports it."""
    importers = [
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(
            name.split(".")[0] == "rocket_rides"
            for name in (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
        )
    ]
    assert importers == []


def test_idempotence_demo_is_loaded_by_name():
    from click.testing import CliRunner

    from idempotence.cli import main

    listed = CliRunner().invoke(main, ["--help"])
    assert listed.exit_code == 0 and "demo" in listed.output
    shown = CliRunner().invoke(main, ["demo", "--help"])
    assert shown.exit_code == 0, shown.output
    assert "serve" in shown.output


def private_store_imports(graph: dict[str, set[str]], importer_prefix: str) -> dict[str, set[str]]:
    """The private modules of ``idempotence.stores`` (a path part after ``stores`` that
    starts with ``_``) that the modules under ``importer_prefix`` import."""
    found: dict[str, set[str]] = {}
    for name, imported in graph.items():
        if not name.startswith(importer_prefix):
            continue
        private = {
            module
            for module in imported
            if module.startswith("idempotence.stores.")
            and any(part.startswith("_") for part in module.split(".")[2:])
        }
        if private:
            found[name] = private
    return found


def test_the_contrib_stores_use_only_the_public_store_interface():
    """The SQLAlchemy and Django stores (and the Alembic and Django migration helpers)
    are built the way a store outside the package would be: on idempotence.stores.sql,
    idempotence.stores.keyvalue and the backends' public modules, never on a private
    ``idempotence.stores._*`` module (issue 31: the store interface, public)."""
    assert private_store_imports(import_graph(), "idempotence.contrib") == {}


def test_the_private_import_finder_finds_one():
    # The check above can fail: an edge to a private store module is reported.
    graph = import_graph()
    graph["idempotence.contrib.alembic"] = graph["idempotence.contrib.alembic"] | {
        "idempotence.stores._sql.ops"
    }
    graph["idempotence.contrib.django_app.store"] = graph[
        "idempotence.contrib.django_app.store"
    ] | {"idempotence.stores.postgres._store"}
    assert private_store_imports(graph, "idempotence.contrib") == {
        "idempotence.contrib.alembic": {"idempotence.stores._sql.ops"},
        "idempotence.contrib.django_app.store": {"idempotence.stores.postgres._store"},
    }


def test_shared_code_is_named_for_the_modules_that_share_it():
    """One convention (issue 31): what a sync module and its async source share, without
    I/O, is ``<name>_shared.py`` beside ``<name>.py`` (or ``_<name>.py``), in stores,
    maintenance, flows and contrib alike (a bare ``_shared.py`` is what a package's
    modules share); no ``_base`` module is left to mean something else."""
    shared = sorted(p for p in PACKAGE.rglob("*_shared.py") if p.name != "_shared.py")
    assert shared, "the convention names at least the stores' and the services' modules"
    orphans = [
        path.relative_to(PACKAGE).as_posix()
        for path in shared
        if not any(
            (
                path.parent / f"{prefix}{path.name.lstrip('_').removesuffix('_shared.py')}.py"
            ).exists()
            for prefix in ("", "_")
        )
    ]
    assert orphans == []
    assert sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*_base.py")) == []
