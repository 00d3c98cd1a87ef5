"""A small application for the CLI tests, imported by the ``idempotence`` command
(``--flows tests.maintenance.app:flows`` and friends) in a subprocess."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from idempotence import StoredResponse
from idempotence.flows import Advance, Finish, Flow, FlowRegistry, PhaseContext
from idempotence.maintenance import Job, JobRegistry, ReconcilerRegistry

flows = FlowRegistry()
checkout = flows.register(Flow("cli_checkout"))


@checkout.phase("started")
def reserve(ctx: PhaseContext) -> Advance:
    return Advance("reserved")


@checkout.phase("reserved")
def confirm(ctx: PhaseContext) -> Finish:
    ctx.stage("receipt", {"key": ctx.lease.key})
    return Finish(StoredResponse.of(201, body='{"ok": true}'))


# An async application's flow (F7): a coroutine phase and a coroutine foreign call.
# ``idempotence worker --flows tests.maintenance.app:async_flows`` sees them and runs
# the services on an async store.
async_flows = FlowRegistry()
async_checkout = async_flows.register(Flow("cli_async_checkout"))


@async_checkout.phase("started")
async def reserve_async(ctx: PhaseContext) -> Advance:
    await asyncio.sleep(0)
    return Advance("reserved")


async def charge_async(ctx: Any) -> str:
    await asyncio.sleep(0)
    return str(ctx.key_for("charge"))


async def confirm_async(ctx: PhaseContext, charge: str) -> Finish:
    await asyncio.sleep(0)
    ctx.stage("receipt", {"key": ctx.lease.key})
    return Finish(StoredResponse.of(201, body=f'{{"charge": "{charge}"}}'))


async_checkout.foreign("reserved", name="charge", call=charge_async, record=confirm_async)

jobs = JobRegistry()


@jobs.register("receipt")
def receipt(job: Job) -> None:
    """Nothing to send in a test: the job's row turning 'done' is the proof."""


class Rides:
    """Foreign charges a, b, c; local rides b, c, d."""

    def foreign_ids(self, since: datetime, until: datetime) -> Iterable[str]:
        return ["a", "b", "c"]

    def local_ids(self, since: datetime, until: datetime) -> Iterable[str]:
        return ["b", "c", "d"]


class Receipts:
    """Both sides agree: sent receipts x and y."""

    def foreign_ids(self, since: datetime, until: datetime) -> Iterable[str]:
        return ["x", "y"]

    def local_ids(self, since: datetime, until: datetime) -> Iterable[str]:
        return ["y", "x"]


reconcilers = ReconcilerRegistry()
reconcilers.register("rides", Rides())
reconcilers.register("receipts", Receipts())

not_a_registry = 42
