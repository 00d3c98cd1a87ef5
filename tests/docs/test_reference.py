"""The API reference renders: the site is built, and its pages are read as a reader
gets them.

The docstrings are Google style in Markdown (mkdocs.yml), so a Sphinx role left in one
(``:class:`X```) shows as literal text, and a doctest (``>>>`` lines) as quotes nested
three deep; every public name (in ``__all__`` of a module the reference documents)
has a docstring, or its entry on the page is a bare signature.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import griffe
import pytest

from tests.docs.blocks import ROOT

#: The slow tier: the site is built (half a minute), and griffe reads the package.
pytestmark = pytest.mark.slow

#: A Sphinx role as the page shows it, its target in code (``:class:`X``` renders as
#: ``:class:<code>X</code>``).
LITERAL_ROLE = re.compile(r":(?:py:)?(?:class|func|mod|meth|attr|data|exc|obj|const):(?:<code>|`)")
#: How Markdown renders ``>>> x``: a quote in a quote in a quote.
NESTED_QUOTES = re.compile(r"<blockquote>\s*<blockquote>")


def reference_modules() -> list[str]:
    """The modules the reference pages document (their ``::: module`` lines)."""
    pages = sorted((ROOT / "docs" / "reference").glob("*.md"))
    return [name for page in pages for name in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def pages(site: Path) -> list[Path]:
    found = sorted(site.rglob("*.html"))
    assert any("reference" in page.parts for page in found), found
    return found


def test_no_page_shows_a_sphinx_role(site: Path) -> None:
    shown = {
        str(page.relative_to(site)): len(LITERAL_ROLE.findall(page.read_text()))
        for page in pages(site)
    }
    assert {page: n for page, n in shown.items() if n} == {}


def test_no_page_shows_a_doctest_as_quotes(site: Path) -> None:
    quoted = [
        str(page.relative_to(site))
        for page in pages(site)
        if NESTED_QUOTES.search(page.read_text())
    ]
    assert quoted == []


def test_the_reference_links_its_cross_references(site: Path) -> None:
    """The roles became links: the idempotence page links to the errors it names."""
    page = (site / "reference" / "idempotence" / "index.html").read_text()
    assert page.count('class="autorefs autorefs-internal"') > 50
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*href="[^"]*#idempotence', page)


def test_every_public_name_has_a_docstring() -> None:
    loader = griffe.GriffeLoader(search_paths=[str(ROOT / "src")])
    # Loading a submodule loads its whole package again, so the package is read once
    # and each documented module is looked up in it (24 loads took minutes).
    package = loader.load("idempotence")
    loader.resolve_aliases(implicit=False, external=False)
    modules = {
        name: package if name == "idempotence" else package[name.removeprefix("idempotence.")]
        for name in reference_modules()
    }
    assert len(modules) >= 10, modules
    bare = []
    for name, module in modules.items():
        exported = [e if isinstance(e, str) else e.name for e in module.exports or []]
        if not exported:  # no __all__: what the module defines, by its public names
            exported = [
                member
                for member, obj in module.members.items()
                if not member.startswith("_") and not obj.is_alias
            ]
        for export in exported:
            docstring = module[export].docstring
            if docstring is None or not docstring.value.strip():
                bare.append(f"{name}.{export}")
    assert bare == []


def test_no_docstring_of_the_package_is_left_in_sphinx_style() -> None:
    """One style across the package, the private modules included (the reference does
    not show them, but their names move into public pages): no role, no doctest. A
    left-over one is converted by ``python scripts/docstrings.py``."""
    role = re.compile(r":(?:py:)?(?:class|func|mod|meth|attr|data|exc|obj|const):`")
    doctest = re.compile(r"^\s*>>> ", re.MULTILINE)
    left = [
        str(path.relative_to(ROOT))
        for package in ("idempotence", "rocket_rides")
        for path in sorted((ROOT / "src" / package).rglob("*.py"))
        if role.search(path.read_text()) or doctest.search(path.read_text())
    ]
    assert left == []
