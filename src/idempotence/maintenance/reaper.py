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
:class:`Retention` for the usual choices; ``None`` keeps a key forever (ledgers).

>>> reaper = Reaper(store, ReaperConfig(batch_size=5000))    # doctest: +SKIP
>>> reaper.run_once()                                        # doctest: +SKIP
ReapResult(expired=(), deleted=1200000, ...)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..problems import Problem, ProblemDetails
from ..stores import Store
from . import _ops
from ._ops import ExpiredKey
from ._service import Progress, Service, ServiceConfig, Signals
from .metrics import Metrics


class Retention:
    """The usual retentions, for ``Flow(retention=...)``.

    >>> from idempotence.flows import Flow
    >>> ledger = Flow("ledger_entries", retention=Retention.FOREVER)
    """

    #: Stripe's window: a day of replays (the default).
    DAY: timedelta = timedelta(hours=24)
    #: Clients that retry over a weekend.
    THREE_DAYS: timedelta = timedelta(hours=72)
    WEEK: timedelta = timedelta(days=7)
    #: Never reaped: the key row is part of a ledger.
    FOREVER: None = None


#: What a key that expired before it finished answers to every retry.
EXPIRED_RESPONSE = ProblemDetails.of(
    Problem.REQUEST_EXPIRED,
    "The request was not completed before its Idempotency-Key expired, and it will not "
    "be completed. Check whether its effects happened before sending it again with a "
    "new Idempotency-Key.",
).stored()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaperConfig(ServiceConfig):
    """The reaper's settings; see :class:`ServiceConfig`. Deleting is cheap per row,
    so its batches are large; the pause between them lets requests through."""

    batch_size: int = 1000
    interval: float = 300.0


@dataclass(frozen=True, slots=True)
class ReapResult:
    """What one pass of the reaper did."""

    #: Pending keys finished with the stored 408.
    expired: tuple[ExpiredKey, ...]
    #: Finished keys deleted.
    deleted: int
    batches: int
    seconds: float


class Reaper(Service[ReaperConfig, ReapResult]):
    """Expires abandoned keys and deletes expired ones (B3); see the module docstring."""

    name = "reaper"

    def __init__(
        self,
        store: Store,
        config: ReaperConfig | None = None,
        *,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(store, config or ReaperConfig(), signals=signals, metrics=metrics)

    def _pass(self, stop: threading.Event, progress: Progress | None) -> ReapResult:
        started = time.monotonic()
        d, cfg = self.store.dialect, self.config
        expired: list[ExpiredKey] = []
        deleted = 0

        def expire() -> int:
            found = self.store.perform(
                lambda: _ops.expire_pending(d, EXPIRED_RESPONSE, cfg.batch_size, cfg.query_timeout)
            )
            for key in found:
                self.log.warning(
                    "key %r in scope %r (flow %r) expired unfinished: stored a 408",
                    key.key,
                    key.scope,
                    key.flow,
                    extra={
                        "service": self.name,
                        "scope": key.scope,
                        "key": key.key,
                        "flow": key.flow,
                    },
                )
            self.metrics.keys_expired(len(found))
            expired.extend(found)
            return len(found)

        def delete() -> int:
            nonlocal deleted
            n = self.store.perform(lambda: _ops.reap(d, cfg.batch_size, cfg.query_timeout))
            self.metrics.keys_reaped(n)
            deleted += n
            return n

        # Expire first: a key expired in this pass restarts its retention, so it is
        # not deleted in the same pass; its 408 is there for the late retry.
        batches = self._drain("expired", expire, stop, progress)
        if not stop.is_set():
            batches += self._drain("deleted", delete, stop, progress)
        return ReapResult(tuple(expired), deleted, batches, time.monotonic() - started)

    def _summary(self, result: ReapResult) -> tuple[str, dict[str, Any]]:
        return (
            f"deleted {result.deleted} expired key(s), expired {len(result.expired)} "
            f"unfinished key(s) with a 408, in {result.batches} batch(es)",
            {
                "count": result.deleted + len(result.expired),
                "deleted": result.deleted,
                "expired": len(result.expired),
                "batches": result.batches,
            },
        )
