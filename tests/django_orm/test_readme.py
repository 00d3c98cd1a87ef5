"""The README's Django section shows excerpts of the example shop, which the suite
runs (test_django_orm.py): each excerpt must be in the file its marker names,
verbatim, so the README cannot drift from code that runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_EXCERPT = re.compile(
    r"<!-- not-run: an excerpt of (?P<path>examples/\S+) .*?-->\s*```python\n(?P<code>.*?)```",
    re.DOTALL,
)


def test_the_readme_django_excerpts_are_in_the_example_app() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    excerpts = list(_EXCERPT.finditer(readme))
    assert len(excerpts) >= 4
    for found in excerpts:
        source = (ROOT / found["path"]).read_text(encoding="utf-8")
        assert found["code"] in source, f"README excerpt not in {found['path']}:\n{found['code']}"
