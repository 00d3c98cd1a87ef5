"""The README and the Django guides show excerpts of the example shop, which the suite
runs (test_django_orm.py): each excerpt must be in the file its marker names,
verbatim, so the documentation cannot drift from code that runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_EXCERPT = re.compile(
    r"<!-- not-run: an excerpt of (?P<path>examples/\S+) .*?-->\s*```python\n(?P<code>.*?)```",
    re.DOTALL,
)


DOCUMENTS = [ROOT / "README.md", ROOT / "docs" / "how-to" / "django.md"]
DOCUMENTS += [ROOT / "docs" / "how-to" / "django-orm.md"]


def test_the_documented_django_excerpts_are_in_the_example_app() -> None:
    excerpts = [
        (document, found)
        for document in DOCUMENTS
        for found in _EXCERPT.finditer(document.read_text(encoding="utf-8"))
    ]
    assert len(excerpts) >= 5
    for document, found in excerpts:
        source = (ROOT / found["path"]).read_text(encoding="utf-8")
        assert found["code"] in source, (
            f"{document.name}: excerpt not in {found['path']}:\n{found['code']}"
        )
