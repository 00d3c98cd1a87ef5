"""Turn the package's docstrings from Sphinx's markup into what the reference renders.

mkdocstrings reads Google-style docstrings in Markdown (mkdocs.yml). This script does
the mechanical part of moving a docstring there, in place, and can run again (it only
changes what is left to change):

* a Sphinx role (``:class:`~idempotence.errors.StoreUnavailable```, ``:meth:``,
  ``:func:``, ``:mod:``, ``:attr:``, ``:data:``, ``:exc:``) becomes a cross-reference,
  ``[`StoreUnavailable`][idempotence.errors.StoreUnavailable]``, when its target is on
  a reference page (the site's ``objects.inv`` says), and inline code otherwise (a
  private module, a name the reference does not render); in a comment, always code;
* a doctest (``>>>`` lines and their output) becomes a fenced ``python`` block, the
  output as comments, the ``# doctest:`` directives dropped: the tests never ran them,
  and Markdown shows ``>>>`` lines as quotes nested three deep.

Names are resolved as Python would in the docstring's scope (griffe reads the
imports), so ``:class:`KeyStore``` in a module that imports it links to where it is
documented. Review the diff: the script does not reword anything.

Usage: python scripts/docstrings.py [--check] [--site SITE_DIR] [FILE ...]
(default: every module of src/idempotence and src/rocket_rides; without --site, the
site is built into a temporary directory first, for its inventory).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import re
import subprocess
import sys
import tempfile
import textwrap
import zlib
from collections.abc import Iterable
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGES = ("idempotence", "rocket_rides")

ROLE = re.compile(r":(?:py:)?(class|func|mod|meth|attr|data|exc|obj|const):`([^`]+)`")
DOCTEST_DIRECTIVE = re.compile(r"\s*#\s*doctest:.*$")


def inventory(site: Path) -> set[str]:
    """The identifiers the site's reference documents (its ``objects.inv``)."""
    raw = (site / "objects.inv").read_bytes()
    body = zlib.decompress(raw.split(b"\n", 4)[4]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines() if line.strip()}


def build_site() -> Path:
    site = Path(tempfile.mkdtemp(prefix="docstrings-site-"))
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        check=True,
        env={"NO_MKDOCS_2_WARNING": "1", **__import__("os").environ},
    )
    return site


class Resolver:
    """Sphinx role targets, resolved in a docstring's scope, as reference paths."""

    def __init__(self, documented: set[str]) -> None:
        self.documented = documented
        self.packages = {
            name: griffe.load(name, search_paths=[str(SRC)], resolve_aliases=False)
            for name in PACKAGES
        }
        # Every documented spelling of each object (a class is on its module's page
        # and, re-exported, on the package's).
        self.spellings: dict[str, set[str]] = {}
        for path in documented:
            self.spellings.setdefault(self.canonical(path), set()).add(path)

    def object(self, path: str) -> griffe.Object | griffe.Alias | None:
        top, _, rest = path.partition(".")
        package = self.packages.get(top)
        if package is None:
            return None
        try:
            return package[rest] if rest else package
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None

    def candidates(self, scope: str, target: str) -> Iterable[str]:
        """Full paths ``target`` may mean in ``scope`` (a module, class or function)."""
        if target.startswith("."):
            module = self.module_of(scope)
            dots = len(target) - len(target.lstrip("."))
            obj = self.object(module)
            base = module.split(".")
            # A relative name counts from the module's package (the package itself
            # for an __init__).
            keep = len(base) - dots + (1 if obj is not None and obj.is_package else 0)
            yield ".".join([*base[:keep], target.lstrip(".")])
            return
        first, _, rest = target.partition(".")
        if first in PACKAGES:
            yield target
            return
        parts = scope.split(".")
        for end in range(len(parts), 0, -1):
            obj = self.object(".".join(parts[:end]))
            if obj is None:
                continue
            try:
                found = obj.resolve(first)
            except (griffe.NameResolutionError, AttributeError, KeyError):
                continue
            yield found + ("." + rest if rest else "")
            break
        yield f"idempotence.{target}"

    def module_of(self, scope: str) -> str:
        parts = scope.split(".")
        for end in range(len(parts), 0, -1):
            obj = self.object(".".join(parts[:end]))
            if obj is not None and obj.is_module:
                return obj.path
        return parts[0]

    def link(self, scope: str, target: str) -> str | None:
        """The documented path ``target`` refers to from ``scope``, or None."""
        for candidate in self.candidates(scope, target):
            found = self.spellings.get(self.canonical(candidate), set())
            if candidate in self.documented:
                found = found | {candidate}
            if found:
                return self.prefer(found)
        # A name written bare (a method of another class, say): if exactly one
        # documented identifier ends with it, that one.
        bare = target.lstrip(".")
        matches = {p for p in self.documented if p.endswith("." + bare)}
        canonical = {self.canonical(p) for p in matches}
        if len(canonical) == 1:
            return self.prefer(matches)
        return None

    def canonical(self, path: str) -> str:
        obj = self.object(path)
        try:
            return obj.canonical_path if obj is not None else path
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return path

    def prefer(self, paths: set[str]) -> str:
        """A public spelling (no private module on the way: those move), the one
        deepest in the package (its module's own page) first."""
        return max(
            paths,
            key=lambda p: (not any(part.startswith("_") for part in p.split(".")), p.count("."), p),
        )


def display(target: str, role: str) -> str:
    shown = target.lstrip("~").lstrip(".")
    if target.startswith("~"):
        shown = shown.rpartition(".")[2]
    return shown


def convert_role(match: re.Match[str], scope: str | None, resolver: Resolver) -> str:
    role, target = match.group(1), match.group(2).strip()
    explicit = re.fullmatch(r"(.*?)\s*<(.+)>", target)
    if explicit:
        text, target = explicit.group(1), explicit.group(2)
    else:
        text = display(target, role)
    if scope is not None:
        path = resolver.link(scope, target.lstrip("~"))
        if path is not None:
            return f"[`{text}`][{path}]"
    return f"`{text}`"


def doctests_to_fences(lines: list[str]) -> list[str]:
    """``lines`` (of one docstring) with each doctest as a fenced block."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if not stripped.startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(stripped)]
        code: list[str] = []
        while i < len(lines):
            current = lines[i]
            body = current.strip()
            if not body or (current.rstrip().endswith('"""') and body == '"""'):
                break
            if not current.startswith(indent):
                break
            if body.startswith((">>>", "...")):
                text = body[3:]
                text = text[1:] if text.startswith(" ") else text
                text = DOCTEST_DIRECTIVE.sub("", text)
                if text.strip() or not body.startswith("..."):
                    code.append(text)
            else:
                code.append("# " + body)
            i += 1
        if out and out[-1].strip():
            out.append("")
        out += [indent + "```python", *[indent + c if c else "" for c in code], indent + "```"]
        if i < len(lines) and lines[i].strip() and lines[i].strip() != '"""':
            out.append("")
    return out


#: The line length the code is formatted to (ruff's, pyproject.toml), and the one the
#: docstrings are written to: a paragraph that a link made longer than the first is
#: wrapped again to the second.
LIMIT = 100
WIDTH = 88
_BULLET = re.compile(r"(?:[*-]|\d+\.)\s+")


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def reflow(lines: list[str]) -> list[str]:
    """``lines`` (of one docstring) with each paragraph that a link made longer than
    the line length wrapped again; other paragraphs, code blocks and tables as they
    were."""
    out: list[str] = []
    fenced = False
    i = 0
    while i < len(lines):
        line, text = lines[i], lines[i].strip()
        if text.startswith("```"):
            fenced = not fenced
        if fenced or text.startswith("```") or not text:
            out.append(line)
            i += 1
            continue
        indent = _indent(line)
        bullet = _BULLET.match(text)
        following = indent + " " * len(bullet.group(0)) if bullet else indent
        end = i + 1
        while end < len(lines):
            nxt = lines[end].strip()
            if not nxt or nxt.startswith("```") or _BULLET.match(nxt) or nxt == '"""':
                break
            if _indent(lines[end]) != following:
                break
            end += 1
        paragraph = lines[i:end]
        table = text.startswith(("|", "==", "+-")) or "  " in text.strip('"')
        if any(len(row) > LIMIT for row in paragraph) and not table:
            words = " ".join(row.strip() for row in paragraph)
            out += textwrap.wrap(
                words,
                WIDTH,
                initial_indent=indent,
                subsequent_indent=following,
                break_long_words=False,
                break_on_hyphens=False,
            )
        else:
            out += paragraph
        i = end
    return out


def docstring_spans(tree: ast.Module, module: str) -> list[tuple[int, int, str]]:
    """(first line, last line, scope) of every docstring, 1-based and inclusive."""
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, scope: str) -> None:
        body = getattr(node, "body", None)
        if isinstance(body, list) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and isinstance(
                    node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
                )
            ):
                spans.append((first.lineno, first.end_lineno or first.lineno, scope))
            # A string right after an assignment documents the attribute (griffe).
            for before, after in itertools.pairwise(body):
                if (
                    isinstance(before, ast.Assign | ast.AnnAssign)
                    and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    spans.append((after.lineno, after.end_lineno or after.lineno, scope))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, f"{scope}.{child.name}")

    visit(tree, module)
    return spans


def comments_to_docstrings(text: str) -> str:
    """Sphinx's ``#:`` comment above a module's or class's attribute, as the string
    after the assignment that griffe (and so the reference) reads as its docstring."""
    lines = text.splitlines(keepends=True)
    # (first comment line, statement's first line, its last, its indent, the text)
    moves: list[tuple[int, int, int, int, str]] = []

    def visit(body: list[ast.stmt]) -> None:
        for index, stmt in enumerate(body):
            if isinstance(stmt, ast.ClassDef):
                visit(stmt.body)
            if not isinstance(stmt, ast.Assign | ast.AnnAssign):
                continue
            following = body[index + 1] if index + 1 < len(body) else None
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                continue  # documented already
            first = stmt.lineno - 1  # 0-based line of the statement
            indent = stmt.col_offset
            start = first
            while start > 0 and lines[start - 1].strip().startswith("#:"):
                if _indent(lines[start - 1]) != " " * indent:
                    break
                start -= 1
            if start == first:
                continue
            said = [line.strip()[2:].removeprefix(" ").rstrip() for line in lines[start:first]]
            end = (stmt.end_lineno or stmt.lineno) - 1
            moves.append((start, first, end, indent, "\n".join(said)))

    visit(ast.parse(text).body)
    for start, first, end, indent, said in sorted(moves, reverse=True):
        pad = " " * indent
        doc = [pad + row if row else "" for row in f'"""{said}"""'.split("\n")]
        lines[start : end + 1] = [*lines[first : end + 1], *(row + "\n" for row in doc)]
    return "".join(lines)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def convert(path: Path, resolver: Resolver) -> str:
    text = comments_to_docstrings(path.read_text())
    lines = text.splitlines(keepends=True)
    scopes: dict[int, str] = {}
    spans = docstring_spans(ast.parse(text), module_name(path))
    for first, last, scope in spans:
        for number in range(first, last + 1):
            scopes[number] = scope
    converted = []
    for number, line in enumerate(lines, start=1):
        scope = scopes.get(number)
        converted.append(ROLE.sub(lambda m, s=scope: convert_role(m, s, resolver), line))
    # Doctests, and paragraphs a link made too long, docstring by docstring, from the
    # last (so that the line numbers of the others stay right).
    for first, last, _ in sorted(spans, reverse=True):
        chunk = [line.rstrip("\n") for line in converted[first - 1 : last]]
        done = reflow(doctests_to_fences(chunk))
        if done != chunk:
            converted[first - 1 : last] = [line + "\n" for line in done]
    return "".join(converted)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--site", type=Path, default=None)
    parser.add_argument("--check", action="store_true", help="only say what would change")
    args = parser.parse_args()
    files = args.files or sorted(p for name in PACKAGES for p in (SRC / name).rglob("*.py"))
    # The sync twins are generated from their async sources (scripts/unasync.py): convert
    # the sources, then regenerate.
    sys.path.insert(0, str(ROOT / "scripts"))
    from unasync import PACKAGE, sources

    generated = {
        (PACKAGE / source).with_name(Path(source).name.removesuffix("_async.py") + ".py")
        for source in sources()
    }
    files = [path for path in files if path.resolve() not in generated]
    site = args.site or build_site()
    resolver = Resolver(inventory(site))
    changed = []
    for path in files:
        path = path.resolve()
        new = convert(path, resolver)
        if new != path.read_text():
            changed.append(path)
            if not args.check:
                path.write_text(new)
    for path in changed:
        print(path.relative_to(ROOT))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
