"""A log formatter that shows the structured fields the library logs with ``extra``.

The background services (and the stores, flows and consumers) log through
`logging` with fields such as ``service``, ``scope``, ``key`` and ``count`` in
``extra``; any handler of the application's sees them as record attributes. This
formatter prints them, as ``key=value`` pairs after the message or as one JSON object
per line (for a log shipper).

```python
handler = logging.StreamHandler()
handler.setFormatter(StructuredFormatter(as_json=True))
```
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra`` fields of ``record``."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class StructuredFormatter(logging.Formatter):
    """``time level logger message key=value ...``, or JSON lines with ``as_json``."""

    def __init__(self, *, as_json: bool = False) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields = fields_of(record)
        if self.as_json:
            data = {
                "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
                "level": record.levelname,
                "logger": record.name,
                "message": record.getMessage(),
                **fields,
            }
            if record.exc_info:
                data["exception"] = self.formatException(record.exc_info)
            return json.dumps(data, default=str)
        text = super().format(record)
        if fields:
            pairs = " ".join(f"{k}={v!r}" for k, v in fields.items())
            first, newline, rest = text.partition("\n")  # keep a traceback below
            text = f"{first} {pairs}{newline}{rest}"
        return text
