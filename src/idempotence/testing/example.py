"""An example flow: book a ride and charge for it, in three phases (DESIGN 5).

Read it as a template for a flow of your own::

    started ──▶ ride_created ──charge──▶ charge_created ──▶ finished (201)
                              └─ declined card ─────────▶ finished (402)

* ``started``, an atomic phase: validate the request, then insert the ride and an
  audit row in the phase's transaction, which commits with the checkpoint (R2). A
  bad request is rejected before anything commits, so the client may correct it and
  retry with the same key (R5).
* ``ride_created``, the foreign step ``charge``: charge the card at the provider,
  outside any transaction (R3), with the derived key ``ctx.key_for("charge")`` (R4),
  so a resumed run sends the same key and the provider's dedup absorbs the repeat.
  Its recording phase stores the charge id on the ride and advances, or, for a
  declined card, finishes with a stored 402 (R5).
* ``charge_created``, an atomic phase: stage the ``send_receipt`` job, which commits
  with the phase (R7), and finish with 201 and the ride.

The phases are written once for sync and async stores: each is a generator that
yields ``(sql, params)`` and is sent the rows back (`sql_phase`), the way the
library writes its own store operations. The SQL uses ``:name`` placeholders, which
the store's transaction takes on every database.

```python
provider = FakeProvider("provider.sqlite3")
store = SqliteStore("keys.sqlite3"); store.migrate(); create_tables(store)
flow = rides_flow(provider)
result = flow.run(store, ride_request(flow, scope="acct_1", key="k1"))
result.response.status
# 201
```

`crash_target` hands the flow to the crash harness
(``idempotence.testing.example:crash_target``).
"""

from __future__ import annotations

import inspect
import json
import sqlite3
from collections.abc import Awaitable, Callable, Generator, Mapping
from datetime import timedelta
from typing import Any, TypeAlias

from ..database import open_async_sql_store, open_sql_store
from ..fingerprint import fingerprint
from ..flows import (
    Advance,
    Finish,
    Flow,
    ForeignContext,
    Observer,
    PhaseContext,
    PhaseResult,
    Reject,
    problem,
)
from ..states import ClaimRequest, KeyRecord, StoredResponse
from ..stores import Store
from .harness import Target
from .provider import Charge, FakeProvider

__all__ = [
    "create_tables",
    "crash_target",
    "ride_request",
    "rides_flow",
    "sql_phase",
]

# -- writing a phase once for sync and async stores ---------------------------------------

Row = dict[str, Any]
Statements: TypeAlias = Generator[tuple[str, Mapping[str, Any]], list[Row], PhaseResult]
"""A phase written as statements: yields ``(sql, params)``, is sent each one's rows."""


def _run(tx: Any, statements: Statements) -> PhaseResult | Awaitable[PhaseResult]:
    """Drive ``statements`` on ``tx``: synchronously on a sync transaction; on an async
    one, the first awaitable turns the rest into a coroutine."""
    try:
        sql, params = next(statements)
        while True:
            rows = tx.execute(sql, dict(params))
            if inspect.isawaitable(rows):
                return _run_async(tx, statements, rows)
            sql, params = statements.send(rows)
    except StopIteration as done:
        result: PhaseResult = done.value
        return result


async def _run_async(tx: Any, statements: Statements, pending: Awaitable[list[Row]]) -> Any:
    try:
        rows = await pending
        while True:
            sql, params = statements.send(rows)
            rows = await tx.execute(sql, dict(params))
    except StopIteration as done:
        return done.value


def sql_phase(
    fn: Callable[..., Statements],
) -> Callable[..., PhaseResult | Awaitable[PhaseResult]]:
    """Make a phase of a generator of statements, for ``run`` and ``run_async`` alike.

    ```python
    @flow.phase("started")
    @sql_phase
    def create(ctx):
        rows = yield ("INSERT INTO t (k) VALUES (:k) RETURNING id", {"k": ctx.lease.id})
        return Advance("created")
    ```
    """

    def phase(ctx: PhaseContext, *args: Any) -> PhaseResult | Awaitable[PhaseResult]:
        return _run(ctx.tx, fn(ctx, *args))

    phase.__name__ = phase.__qualname__ = getattr(fn, "__name__", "phase")
    phase.__doc__ = fn.__doc__
    return phase


# -- the domain tables --------------------------------------------------------------------

# Rides and audit rows point at the key row that created them (DESIGN 3), so a resumed
# run finds what an earlier attempt committed. There is deliberately no UNIQUE
# (scope, key_id): the atomic phase alone makes one ride per key, and the crash
# harness must be able to see a second one if it did not. An application would add
# the constraint as a second line of defence. (ON DELETE SET NULL with a column list
# needs PostgreSQL 15.)
_TABLES = {
    "postgres": [
        """CREATE TABLE IF NOT EXISTS rides (
            id          bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            scope       text    NOT NULL,
            key_id      bigint,
            origin      text    NOT NULL,
            destination text    NOT NULL,
            amount      integer NOT NULL,
            status      text    NOT NULL,
            charge_id   text,
            FOREIGN KEY (scope, key_id) REFERENCES idempotency_keys (scope, id)
                ON DELETE SET NULL (key_id)
        )""",
        "CREATE INDEX IF NOT EXISTS rides_key_idx ON rides (scope, key_id)",
        """CREATE TABLE IF NOT EXISTS ride_audit (
            id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            scope   text   NOT NULL,
            key_id  bigint,
            ride_id bigint NOT NULL REFERENCES rides (id),
            action  text   NOT NULL,
            FOREIGN KEY (scope, key_id) REFERENCES idempotency_keys (scope, id)
                ON DELETE SET NULL (key_id)
        )""",
        "CREATE INDEX IF NOT EXISTS ride_audit_key_idx ON ride_audit (scope, key_id)",
    ],
    "sqlite": [
        """CREATE TABLE IF NOT EXISTS rides (
            id          INTEGER PRIMARY KEY,
            scope       TEXT    NOT NULL,
            key_id      INTEGER REFERENCES idempotency_keys (id) ON DELETE SET NULL,
            origin      TEXT    NOT NULL,
            destination TEXT    NOT NULL,
            amount      INTEGER NOT NULL,
            status      TEXT    NOT NULL,
            charge_id   TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS rides_key_idx ON rides (scope, key_id)",
        """CREATE TABLE IF NOT EXISTS ride_audit (
            id      INTEGER PRIMARY KEY,
            scope   TEXT    NOT NULL,
            key_id  INTEGER REFERENCES idempotency_keys (id) ON DELETE SET NULL,
            ride_id INTEGER NOT NULL REFERENCES rides (id),
            action  TEXT    NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS ride_audit_key_idx ON ride_audit (scope, key_id)",
    ],
}


def create_tables(store: Store) -> None:
    """Create the example's tables (after the store's own migrations)."""
    with store.transaction() as tx:
        dialect = "sqlite" if isinstance(tx.connection, sqlite3.Connection) else "postgres"
        if dialect == "postgres":
            # Several processes may set up one database at once.
            tx.execute("SELECT pg_advisory_xact_lock(7294158302)")
        for statement in _TABLES[dialect]:
            tx.execute(statement)


# -- the flow -----------------------------------------------------------------------------

_RIDE = "SELECT id, origin, destination, amount, status, charge_id FROM rides"


def _ride_of(ctx: PhaseContext) -> dict[str, Any]:
    return {"scope": ctx.lease.scope, "key_id": ctx.lease.id}


# The phases need nothing but their context, so they live at module level; the foreign
# call closes over the provider, so rides_flow defines it.


# At 'started': validate, then the ride and its audit row, with the checkpoint.
@sql_phase
def _create_ride(ctx: PhaseContext) -> Statements:
    params = ctx.params
    amount = params.get("amount")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        # Before anything commits: nothing is stored (R5).
        raise Reject(problem(422, "Invalid Amount", "amount must be a positive integer"))
    rows = yield (
        "INSERT INTO rides (scope, key_id, origin, destination, amount, status)"
        " VALUES (:scope, :key_id, :origin, :destination, :amount, 'created') RETURNING id",
        {
            **_ride_of(ctx),
            "origin": params["origin"],
            "destination": params["destination"],
            "amount": amount,
        },
    )
    yield (
        "INSERT INTO ride_audit (scope, key_id, ride_id, action)"
        " VALUES (:scope, :key_id, :ride_id, 'ride_created')",
        {**_ride_of(ctx), "ride_id": rows[0]["id"]},
    )
    return Advance("ride_created")


# After the charge at 'ride_created': record it on the ride, or finish with the decline.
@sql_phase
def _record_charge(ctx: PhaseContext, charge: Charge) -> Statements:
    status = "declined" if charge.declined else "charged"
    rows = yield (
        "UPDATE rides SET charge_id = :charge_id, status = :status"
        " WHERE scope = :scope AND key_id = :key_id RETURNING id",
        {**_ride_of(ctx), "charge_id": charge.id, "status": status},
    )
    yield (
        "INSERT INTO ride_audit (scope, key_id, ride_id, action)"
        " VALUES (:scope, :key_id, :ride_id, :action)",
        {**_ride_of(ctx), "ride_id": rows[0]["id"], "action": f"charge_{status}"},
    )
    if charge.declined:
        # A terminal answer, stored and replayed like a success (R5).
        return Finish(problem(402, "Card Declined", f"charge {charge.id} was declined"))
    return Advance("charge_created")


# At 'charge_created': stage the receipt and answer with the ride.
@sql_phase
def _finish_ride(ctx: PhaseContext) -> Statements:
    rows = yield (f"{_RIDE} WHERE scope = :scope AND key_id = :key_id", _ride_of(ctx))
    ride = rows[0]
    ctx.stage("send_receipt", {"ride_id": ride["id"]})
    body = json.dumps(ride, sort_keys=True, separators=(",", ":"))
    return Finish(StoredResponse.of(201, {"content-type": "application/json"}, body))


def rides_flow(
    provider: FakeProvider,
    *,
    name: str = "rides",
    lock_timeout: timedelta = timedelta(seconds=30),
    idempotent: bool = True,
) -> Flow:
    """The example flow, charging through ``provider``.

    ``idempotent=False`` charges without an idempotency key, as with a provider that
    has none: the flow then never repeats the charge, and a crash during it or an
    indeterminate failure leaves the key errored, for a human (R6).
    """
    flow = Flow(name, lock_timeout=lock_timeout)

    def charge(ctx: ForeignContext) -> Charge:
        # No transaction is open here (R3), and the key is derived from the key row
        # (R4): a resumed run charges with the same key, and is not charged twice.
        return provider.charge(
            ctx.params["amount"],
            ctx.params["card"],
            idempotency_key=ctx.key_for("charge") if idempotent else None,
            reference=f"{ctx.record.scope}/{ctx.record.key}",
        )

    flow.phase("started")(_create_ride)
    flow.foreign(
        "ride_created", name="charge", call=charge, record=_record_charge, idempotent=idempotent
    )
    flow.phase("charge_created")(_finish_ride)
    return flow


def ride_request(
    flow: Flow,
    *,
    scope: str,
    key: str,
    origin: str = "Gare du Nord",
    destination: str = "Orly",
    amount: Any = 2000,
    card: str = "tok_visa",
) -> ClaimRequest:
    """The claim request of ``POST /v1/rides`` with this body."""
    body = {"origin": origin, "destination": destination, "amount": amount, "card": card}
    raw = json.dumps(body).encode()
    return flow.request(
        scope=scope,
        key=key,
        fingerprint=fingerprint("POST", "/v1/rides", raw, "application/json"),
        params=body,
        path="/v1/rides",
    )


# -- for the crash harness ----------------------------------------------------------------

_COUNT = "SELECT count(*) AS n FROM {table} WHERE scope = :scope AND key_id = :key_id"


def crash_target(config: Mapping[str, Any]) -> Target:
    """The example flow as a crash-harness target.

    ``config``: ``database`` (a URL, as for [`open_store`][idempotence.database.open_store], already
    migrated and with `create_tables` applied), ``provider`` (the provider's
    SQLite file), and optionally ``lock_timeout`` (seconds), ``card``, ``amount`` and
    ``idempotent`` (see `rides_flow`).
    """
    provider = FakeProvider(config["provider"])
    idempotent = bool(config.get("idempotent", True))
    flow = rides_flow(
        provider,
        lock_timeout=timedelta(seconds=config.get("lock_timeout", 30)),
        idempotent=idempotent,
    )

    def request(scope: str, key: str) -> ClaimRequest:
        return ride_request(
            flow,
            scope=scope,
            key=key,
            amount=config.get("amount", 2000),
            card=config.get("card", "tok_visa"),
        )

    def census(store: Store, record: KeyRecord) -> dict[str, int]:
        counts: dict[str, int] = {}
        where = {"scope": record.scope, "key_id": record.id}
        with store.transaction() as tx:
            for table in ("rides", "ride_audit", "idempotence_staged_jobs"):
                counts[table] = int(tx.execute(_COUNT.format(table=table), where)[0]["n"])
        reference = f"{record.scope}/{record.key}"
        counts["provider charges"] = len(provider.charges(reference=reference))
        if not idempotent:
            # Without a key, even asking twice is a defect: the call must never repeat.
            counts["provider requests"] = provider.received(reference=reference)
        return counts

    def instrument(observer: Observer) -> None:
        provider.before_commit = lambda charge: observer("provider:charge:before_commit")
        provider.after_commit = lambda charge: observer("provider:charge:after_commit")

    return Target(
        flow=flow,
        open_store=lambda: open_sql_store(config["database"]),
        open_async_store=lambda: open_async_sql_store(config["database"]),
        request=request,
        census=census,
        instrument=instrument,
    )
