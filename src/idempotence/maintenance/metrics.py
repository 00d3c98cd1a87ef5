"""An old import path of the background services' Prometheus metrics (F5), kept working:
they live in [`idempotence.metrics`][idempotence.metrics], with the store's own, on the
same registry, and the library imports them from there.

```python
from idempotence.maintenance.metrics import default_metrics
default_metrics().keys_swept(3)          # counts, or does nothing
```
"""

from __future__ import annotations

from ..metrics import AVAILABLE, Metrics, default_metrics

__all__ = ["AVAILABLE", "Metrics", "default_metrics"]
