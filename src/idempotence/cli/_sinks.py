"""``idempotence worker --sink``: where the enqueuer delivers staged jobs (B4)."""

from __future__ import annotations

from typing import Any

import click

from ._shared import ImportType

NO_RUNNER = (
    "this worker runs no jobs (no --jobs) and has no --sink, so the jobs your "
    "flows stage are moved to the built-in job table and wait there. Run the jobs here "
    "with --jobs myapp.jobs:registry, elsewhere with `idempotence run-jobs`, or send "
    "them to your queue with --sink amqp://... or --sink myapp.celery:app."
)


class SinkType(click.ParamType[Any]):
    """An AMQP URL (RabbitMQ), or ``module:attribute`` naming a Celery app or a sink."""

    name = "URL|MODULE:ATTRIBUTE"

    def convert(self, value: object, param: object, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        from ..maintenance.sinks import CelerySink, RabbitMQSink

        if value.startswith(("amqp://", "amqps://")):
            try:
                return RabbitMQSink(value)
            except ImportError:
                self.fail("a RabbitMQ sink needs pika: pip install 'idempotence[rabbitmq]'")
        found = ImportType().convert(value, param, ctx)
        if callable(getattr(found, "deliver", None)):
            return found
        if callable(getattr(found, "send_task", None)):  # a Celery app
            try:
                return CelerySink(found)
            except Exception as exc:
                self.fail(str(exc))
        self.fail(
            f"{value!r} is neither an amqp:// URL, a Celery app nor a sink (an object with "
            "deliver(store, tx, jobs))"
        )
