"""The sweeper (B1): release locks whose holder stopped renewing them.

A lock older than its key's own ``lock_timeout`` means the worker that held it
crashed, hung or lost its network. The sweeper unlocks the key and bumps its fencing
token, so that if the holder was only paused (GC, SIGSTOP, a partition) its late
checkpoint is refused (F1) rather than committed over the next worker's. Each key it
releases is a crash signal: logged with its scope, key and flow, and counted.

Claims take over expired locks by themselves (P5); the sweeper makes the state
observable (a key shows ``pending`` instead of a stale ``processing``) and hands the
key to the completer (B2) without waiting for a client's retry.

```python
sweeper = AsyncSweeper(store)
await sweeper.run_once()
# SweepResult(swept=(...), batches=1, seconds=0.004)
```
"""

from __future__ import annotations

import time
from typing import Any

from .._concurrency import AsyncEvent
from ..metrics import Metrics
from ..stores import AsyncStore
from . import _ops
from ._ops import SweptKey
from ._service_async import AsyncService
from ._service_shared import Progress, Signals
from ._sweeper_shared import SweeperConfig, SweepResult, log_swept, sweep_summary

__all__ = ["AsyncSweeper", "SweepResult", "SweeperConfig"]


class AsyncSweeper(AsyncService[SweeperConfig, SweepResult]):
    """Releases expired locks in batches (B1); see the module docstring."""

    name = "sweeper"

    def __init__(
        self,
        store: AsyncStore,
        config: SweeperConfig | None = None,
        *,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(store, config or SweeperConfig(), signals=signals, metrics=metrics)

    async def _pass(self, stop: AsyncEvent, progress: Progress | None) -> SweepResult:
        started = time.monotonic()
        swept: list[SweptKey] = []

        async def batch() -> int:
            found = await self.store._perform(
                lambda d: _ops.sweep(d, self.config.batch_size, self.config.query_timeout)
            )
            for key in found:
                log_swept(self.log, self.name, key)
            self.metrics.keys_swept(len(found))
            swept.extend(found)
            return len(found)

        batches = await self._drain("swept", batch, stop, progress)
        return SweepResult(tuple(swept), batches, time.monotonic() - started)

    def _summary(self, result: SweepResult) -> tuple[str, dict[str, Any]]:
        return sweep_summary(result)
