"""A three-phase flow for the completer's tests: an order row, a charge at a "provider"
that counts calls per derived key, and a finish that stages a receipt job.

Recovery points: ``started`` -> ``order_created`` -> ``charged`` -> finished. Faults
make a step raise the first time it runs for a key, which leaves the key unlocked at
that step's recovery point, as a crash would.

:func:`checkout_flow` is written once for sync and async stores (its phases are
statements, :func:`~idempotence.testing.example.sql_phase`), so the sync and the async
completer resume the same flow; :func:`async_checkout_flow` is the same flow written
the way an async application writes it, with coroutine phases and foreign call, which
only the async completer can resume (F7).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable
from typing import Any

from idempotence import StoredResponse
from idempotence.flows import Advance, Finish, Flow, FlowRegistry, PhaseContext
from idempotence.testing.example import Statements, sql_phase
from tests.maintenance.support import Backend
from tests.support.sql_dialects import SQL

#: The application's tables, in types every SQL database of the suites takes.
TABLES = [
    "CREATE TABLE orders (key_id BIGINT PRIMARY KEY, scope TEXT NOT NULL, charge TEXT)",
    "CREATE TABLE provider_charges (derived_key VARCHAR(255) PRIMARY KEY, calls INT NOT NULL)",
]

#: The steps a fault can be injected at.
STEPS = ("create_order", "charge_call", "record_charge", "finish")


class Faults:
    """Which steps fail once, for which keys."""

    def __init__(self) -> None:
        self._armed: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def arm(self, step: str, keys: Iterable[str]) -> None:
        assert step in STEPS
        with self._lock:
            self._armed.update((step, key) for key in keys)

    def trip(self, step: str, key: str) -> None:
        with self._lock:
            armed = (step, key) in self._armed
            self._armed.discard((step, key))
        if armed:
            raise RuntimeError(f"injected fault at {step} for {key}")


def checkout_flow(db: Backend, faults: Faults, name: str = "checkout") -> Flow:
    flow = Flow(name)

    @flow.phase("started")
    @sql_phase
    def create_order(ctx: PhaseContext) -> Statements:
        yield (
            "INSERT INTO orders (key_id, scope) VALUES (:id, :scope)",
            {"id": ctx.lease.id, "scope": ctx.lease.scope},
        )
        faults.trip("create_order", ctx.lease.key)
        return Advance("order_created")

    def charge(ctx: Any) -> str:
        faults.trip("charge_call", ctx.lease.key)
        return provider_charge(db, ctx.key_for("charge"))

    @sql_phase
    def record_charge(ctx: PhaseContext, charge_id: str) -> Statements:
        yield (
            "UPDATE orders SET charge = :charge WHERE key_id = :id",
            {"charge": charge_id, "id": ctx.lease.id},
        )
        faults.trip("record_charge", ctx.lease.key)
        return Advance("charged")

    flow.foreign("order_created", name="charge", call=charge, record=record_charge)

    @flow.phase("charged")
    def finish(ctx: PhaseContext) -> Finish:
        ctx.stage("receipt", {"key": ctx.lease.key})
        faults.trip("finish", ctx.lease.key)
        return finished_order(ctx)

    return flow


def async_checkout_flow(db: Backend, faults: Faults, name: str = "async_checkout") -> Flow:
    """:func:`checkout_flow` with coroutine phases and a coroutine foreign call."""
    flow = Flow(name)

    @flow.phase("started")
    async def create_order(ctx: PhaseContext) -> Advance:
        await ctx.tx.execute(
            db.sql("INSERT INTO orders (key_id, scope) VALUES (%(id)s, %(scope)s)"),
            {"id": ctx.lease.id, "scope": ctx.lease.scope},
        )
        faults.trip("create_order", ctx.lease.key)
        return Advance("order_created")

    async def charge(ctx: Any) -> str:
        faults.trip("charge_call", ctx.lease.key)
        return await asyncio.to_thread(provider_charge, db, ctx.key_for("charge"))

    async def record_charge(ctx: PhaseContext, charge_id: str) -> Advance:
        await ctx.tx.execute(
            db.sql("UPDATE orders SET charge = %(charge)s WHERE key_id = %(id)s"),
            {"charge": charge_id, "id": ctx.lease.id},
        )
        faults.trip("record_charge", ctx.lease.key)
        return Advance("charged")

    flow.foreign("order_created", name="charge", call=charge, record=record_charge)

    @flow.phase("charged")
    async def finish(ctx: PhaseContext) -> Finish:
        ctx.stage("receipt", {"key": ctx.lease.key})
        faults.trip("finish", ctx.lease.key)
        return finished_order(ctx)

    return flow


def provider_charge(db: Backend, derived: str) -> str:
    # The provider's own dedup: a repeated key is counted but charges nothing new.
    upsert = SQL[db.kind].count_again.format(
        pk="derived_key", table="provider_charges", column="calls"
    )
    db.execute(
        f"INSERT INTO provider_charges (derived_key, calls) VALUES (%(k)s, 1) {upsert}",
        {"k": derived},
    )
    return derived


def finished_order(ctx: PhaseContext) -> Finish:
    body = json.dumps({"order": ctx.lease.id})
    return Finish(StoredResponse.of(201, {"content-type": "application/json"}, body))


def setup(db: Backend) -> tuple[Faults, Flow, FlowRegistry]:
    for statement in TABLES:
        db.execute(statement)
    faults = Faults()
    flow = checkout_flow(db, faults)
    registry = FlowRegistry()
    registry.register(flow)
    return faults, flow, registry
