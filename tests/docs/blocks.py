"""The fenced code blocks of README.md and the documentation pages, and how each runs.

A block's fate is said by an HTML comment on the line before its fence (blank lines
between are allowed), so a reader of the Markdown sees it too:

* no comment, a ``python`` block: run as a script in a fresh directory;
* ``<!-- run: pytest -->``: the block is a test module, run by pytest;
* ``<!-- run: serve METHOD PATH [HEADER=VALUE ...] [BODY] -->``: the block defines an
  ASGI ``app``, served by uvicorn; the request is sent twice with one Idempotency-Key
  and the second answer must be the first, replayed;
* ``<!-- run: file NAME -->``: the block is saved as NAME in the working directory
  ("save it as app.py"), for the blocks after it to use;
* ``<!-- run: console -->``: a ``console`` block's commands run in bash, ``set -e``;
  ``<!-- run: console against `COMMAND` on port N -->`` starts COMMAND first (on a free
  port, given as ``--port``, and the demo's provider on another, ``--provider-port``,
  replacing N in the block) and checks that each HTTP status the block's comments
  promise is printed;
* ``<!-- not-run: REASON -->``: not run, for the reason given (the test lists them).

A ``<!-- extras: NAME, ... -->`` comment beside that one (before or after it) names the
package extras that provide the block's imports (``pip install -e '.[NAME]'``); a block
without one imports only what the package installs with no extra (test_extras.py).

A ``console`` block must say which. Blocks in other languages (``text``, ``toml``,
...) are output or configuration, not examples, and are listed as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
#: The documents whose examples must run: the README and every documentation page.
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
EXAMPLE_LANGUAGES = {"python", "console"}

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<info>[^\s`]*)")
_MARKER = re.compile(r"^\s*<!--\s*(?P<verb>run|not-run):\s*(?P<arg>.*?)\s*-->\s*$")
_EXTRAS = re.compile(r"^\s*<!--\s*extras:\s*(?P<names>[\w\s,-]*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    verb: str | None  # "run", "not-run" or None
    arg: str
    extras: tuple[str, ...] = ()  # the package extras its marker names

    @property
    def id(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    @property
    def mode(self) -> str:
        """``script``, ``pytest``, ``serve``, ``file``, ``console``, ``not-run`` or
        ``output``."""
        if self.verb == "not-run":
            return "not-run"
        if self.language not in EXAMPLE_LANGUAGES:
            return "output"
        if self.verb == "run":
            return self.arg.split()[0] if self.arg else "script"
        return "script" if self.language == "python" else "unmarked"


def blocks(document: Path) -> list[Block]:
    """Every fenced block of ``document``, with the marker before it."""
    lines = document.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            body.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
            end += 1
        marker, extras = None, None
        before = index - 1
        while before >= 0:  # the comments just above the fence, blank lines between
            line = lines[before]
            if not line.strip():
                pass
            elif marker is None and (hit := _MARKER.match(line)):
                marker = hit
            elif extras is None and (hit := _EXTRAS.match(line)):
                extras = hit
            else:
                break
            before -= 1
        found.append(
            Block(
                document,
                index + 1,
                opening["info"].lower() or "",
                "\n".join(body) + "\n",
                marker["verb"] if marker else None,
                marker["arg"] if marker else "",
                tuple(
                    name.strip()
                    for name in (extras["names"] if extras else "").split(",")
                    if name.strip()
                ),
            )
        )
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for document in DOCUMENTS for block in blocks(document)]
