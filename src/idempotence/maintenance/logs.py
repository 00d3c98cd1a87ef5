"""An old import path of `StructuredFormatter`, kept working:
the formatter lives in `idempotence.logs`, beside the metrics and the traces,
because it shows the structured fields of every logger of the library, not only the
background services'."""

from __future__ import annotations

from ..logs import StructuredFormatter, fields_of

__all__ = ["StructuredFormatter", "fields_of"]
