"""The reaper (B3): expire what nobody will finish, delete what nobody will replay.

A pass has two steps, each in batches until a short page:

1. **Expire.** Unfinished keys past ``expires_at`` that no live worker holds are
   finished with a stored 408 problem response, so a late retry learns the request
   was abandoned (and any zombie's write is refused: every fenced write needs an
   unfinished row). Their retention restarts, like any finish, so the 408 stays
   replayable for as long as a success would have.
2. **Delete.** Finished keys past ``expires_at`` are deleted, oldest first. Never an
   errored key: it waits for a human (R6). Never a locked one.

Retention is per flow, set when the key is claimed (``Flow(retention=...)``): see
[`Retention`][idempotence.maintenance.reaper_async.Retention] for the usual choices;
``None`` keeps a key forever (ledgers).

```python
reaper = AsyncReaper(store, ReaperConfig(batch_size=5000))
await reaper.run_once()
# ReapResult(expired=(), deleted=1200000, ...)
```
"""

from __future__ import annotations

import time
from typing import Any

from .._concurrency import AsyncEvent
from ..metrics import Metrics
from ..stores import AsyncStore
from . import _ops
from ._ops import ExpiredKey
from ._reaper_shared import (
    EXPIRED_RESPONSE,
    ReaperConfig,
    ReapResult,
    Retention,
    log_expired,
    reap_summary,
)
from ._service_async import AsyncService
from ._service_shared import Progress, Signals

__all__ = ["EXPIRED_RESPONSE", "AsyncReaper", "ReapResult", "ReaperConfig", "Retention"]


class AsyncReaper(AsyncService[ReaperConfig, ReapResult]):
    """Expires abandoned keys and deletes expired ones (B3); see the module docstring."""

    name = "reaper"

    def __init__(
        self,
        store: AsyncStore,
        config: ReaperConfig | None = None,
        *,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(store, config or ReaperConfig(), signals=signals, metrics=metrics)

    async def _pass(self, stop: AsyncEvent, progress: Progress | None) -> ReapResult:
        started = time.monotonic()
        cfg = self.config
        expired: list[ExpiredKey] = []
        deleted = 0

        async def expire() -> int:
            found = await self.store._perform(
                lambda d: _ops.expire_pending(
                    d, EXPIRED_RESPONSE, cfg.batch_size, cfg.query_timeout
                )
            )
            for key in found:
                log_expired(self.log, self.name, key)
            self.metrics.keys_expired(len(found))
            expired.extend(found)
            return len(found)

        async def delete() -> int:
            nonlocal deleted
            n = await self.store._perform(lambda d: _ops.reap(d, cfg.batch_size, cfg.query_timeout))
            self.metrics.keys_reaped(n)
            deleted += n
            return n

        # Expire first: a key expired in this pass restarts its retention, so it is
        # not deleted in the same pass; its 408 is there for the late retry.
        batches = await self._drain("expired", expire, stop, progress)
        if not stop.is_set():
            batches += await self._drain("deleted", delete, stop, progress)
        return ReapResult(tuple(expired), deleted, batches, time.monotonic() - started)

    def _summary(self, result: ReapResult) -> tuple[str, dict[str, Any]]:
        return reap_summary(result)
