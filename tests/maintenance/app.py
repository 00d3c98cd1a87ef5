"""A small application for the CLI tests, imported by the ``idempotence`` command
(``--flows tests.maintenance.app:flows`` and friends) in a subprocess."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

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
