"""Helpers for the flow suites: run a flow on any store, and read what it wrote."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from idempotence import ClaimRequest, KeyRecord, StoredResponse
from idempotence.flows import Advance, Finish, Flow, FlowResult, Observer, PhaseContext
from idempotence.testing.example import Statements, sql_phase
from tests.support.stores import EventLoopThread, StoreKind

FP = "f" * 64
OTHER_FP = "e" * 64

#: A table for a test flow's own writes; the same SQL works on both databases.
NOTES_TABLE = (
    "CREATE TABLE IF NOT EXISTS flow_notes (scope TEXT NOT NULL, key_id BIGINT, note TEXT NOT NULL)"
)


@dataclass
class FlowRunner:
    """A flow's run on one of the four stores: ``run`` on a sync store, ``run_async``
    (on the fixture's event loop) on an async one. ``store`` is the sync face."""

    kind: StoreKind
    store: Any
    loop: EventLoopThread
    #: Opens another sync store on the same database: "another worker".
    open_other: Callable[[], Any]

    def run(
        self, flow: Flow, request: ClaimRequest, *, observer: Observer | None = None
    ) -> FlowResult:
        if self.kind.flavour == "sync":
            return flow.run(self.store, request, observer=observer)
        return self.loop.run(flow.run_async(self.store.store, request, observer=observer))

    def get(self, scope: str, key: str = "k") -> KeyRecord | None:
        record: KeyRecord | None = self.store.get(scope, key)
        return record

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self.store.transaction() as tx:
            return list(tx.execute(sql, params or {}))

    def notes(self, scope: str) -> list[str]:
        rows = self.rows(
            "SELECT note FROM flow_notes WHERE scope = :scope ORDER BY note", {"scope": scope}
        )
        return [row["note"] for row in rows]


def request(
    flow: Flow, scope: str, key: str = "k", fingerprint: str = FP, **params: Any
) -> ClaimRequest:
    return flow.request(scope=scope, key=key, fingerprint=fingerprint, params=params)


def write_note(ctx: PhaseContext, text: str) -> Statements:
    """A phase's statement writing ``text`` to flow_notes (a generator to ``yield from``)."""
    yield (
        "INSERT INTO flow_notes (scope, key_id, note) VALUES (:scope, :key_id, :note)",
        {"scope": ctx.lease.scope, "key_id": ctx.lease.id, "note": text},
    )
    return Advance("unused")


def noting(text: str, then: Callable[[PhaseContext], Any]) -> Any:
    """A phase (for sync and async stores, and for recording a foreign call) that
    writes ``text`` and then returns ``then(ctx)``, which may raise instead."""

    @sql_phase
    def phase(ctx: PhaseContext, *_result: Any) -> Statements:
        yield from write_note(ctx, text)
        return then(ctx)

    return phase


def finish(status: int = 201, body: str = "ok") -> Finish:
    return Finish(StoredResponse.of(status, {"content-type": "text/plain"}, body))


def raising(exc: BaseException) -> Callable[[PhaseContext], Any]:
    def then(ctx: PhaseContext) -> Any:
        raise exc

    return then
