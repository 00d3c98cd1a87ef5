"""The Prometheus metrics of the background services (F5): they live in
:mod:`idempotence.metrics`, with the store's own, on the same registry; this module
keeps the old import path working.

>>> from idempotence.maintenance.metrics import default_metrics
>>> default_metrics().keys_swept(3)          # counts, or does nothing
"""

from __future__ import annotations

from ..metrics import AVAILABLE, Metrics, default_metrics

__all__ = ["AVAILABLE", "Metrics", "default_metrics"]
