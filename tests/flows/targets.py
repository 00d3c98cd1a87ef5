"""Crash-harness targets for the tests (importable by the harness's child processes).

``broken_target`` is the example flow with one classic mistake, to prove the harness
sees what it is there to see: a harness that passes a broken flow is worthless.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

from idempotence import open_store
from idempotence.flows import ForeignContext, ForeignStep, Observer
from idempotence.testing import FakeProvider, Target
from idempotence.testing.example import crash_target


def broken_target(config: Mapping[str, Any]) -> Target:
    """The example flow, broken as ``config["mistake"]`` says:

    * ``random_key``: the charge gets a fresh idempotency key on every attempt, not
      the derived one (breaks R4): a repeated call charges again;
    * ``write_in_call``: the foreign call writes a local row itself, outside any
      phase (breaks R2/R3): a repeated call writes it again.
    """
    target = crash_target(config)
    step = target.flow.steps["ride_created"]
    assert isinstance(step, ForeignStep)
    provider = FakeProvider(config["provider"])
    mistake = config["mistake"]

    def random_key(ctx: ForeignContext) -> Any:
        return provider.charge(
            ctx.params["amount"],
            ctx.params["card"],
            idempotency_key=uuid.uuid4().hex,
            reference=f"{ctx.record.scope}/{ctx.record.key}",
        )

    q = "?" if config["database"].startswith("sqlite") else "%s"

    def write_in_call(ctx: ForeignContext) -> Any:
        with open_store(config["database"]) as store, store.transaction() as tx:
            rides = tx.execute(f"SELECT id FROM rides WHERE key_id = {q}", (ctx.record.id,))
            tx.execute(
                "INSERT INTO ride_audit (scope, key_id, ride_id, action)"
                f" VALUES ({q}, {q}, {q}, 'charging')",
                (ctx.record.scope, ctx.record.id, rides[0]["id"]),
            )
        return step.call(ctx)

    calls = {"random_key": random_key, "write_in_call": write_in_call}
    target.flow.steps["ride_created"] = dataclasses.replace(step, call=calls[mistake])

    def instrument(observer: Observer) -> None:
        target.instrument(observer)
        provider.before_commit = lambda charge: observer("provider:charge:before_commit")
        provider.after_commit = lambda charge: observer("provider:charge:after_commit")

    return dataclasses.replace(target, instrument=instrument)
