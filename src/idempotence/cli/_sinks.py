"""``idempotence worker --sink``: where the enqueuer delivers staged jobs (B4)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import click

from ..errors import ConfigurationError
from ._shared import ImportType

NO_RUNNER = (
    "this worker runs no jobs (no --jobs) and has no --sink, so the jobs your "
    "flows stage are moved to the built-in job table and wait there. Run the jobs here "
    "with --jobs myapp.jobs:registry, elsewhere with `idempotence run-jobs`, or send "
    "them to your queue with --sink amqp://... or --sink myapp.celery:app."
)


@dataclass(frozen=True)
class SinkChoice:
    """What ``--sink`` named, checked as it was read; made into a sink once the worker
    knows whether it runs on an async store (``--async``, or an async flow)."""

    given: str
    """The option's value, as typed."""
    url: str | None = None
    """An AMQP URL: RabbitMQ."""
    app: Any = None
    """A Celery app (its broker confirms publishes)."""
    sink: Any = None
    """An object with ``deliver(store, tx, jobs)``: a sink of the user's own."""

    def build(self, use_async: bool) -> Any:
        """The sink for a sync worker, or for an async one; ``click.UsageError`` when
        the user's own sink is of the other kind."""
        from ..maintenance import AsyncCelerySink, AsyncRabbitMQSink, CelerySink, RabbitMQSink

        if self.url is not None:
            try:
                return AsyncRabbitMQSink(self.url) if use_async else RabbitMQSink(self.url)
            except ImportError:
                raise click.UsageError(
                    "a RabbitMQ sink needs pika and aio-pika: pip install 'idempotence[rabbitmq]'"
                ) from None
        if self.app is not None:
            return AsyncCelerySink(self.app) if use_async else CelerySink(self.app)
        if inspect.iscoroutinefunction(self.sink.deliver) != use_async:
            need = (
                "this worker runs on an async store (--async, or a flow with a coroutine "
                "step), so its sink needs `async def deliver(self, store, tx, jobs)`"
                if use_async
                else "this worker runs on a sync store, so its sink needs a plain "
                "`def deliver(self, store, tx, jobs)` (or run the worker with --async)"
            )
            raise click.UsageError(f"--sink {self.given}: {need}")
        return self.sink


class SinkType(click.ParamType[SinkChoice]):
    """An AMQP URL (RabbitMQ), or ``module:attribute`` naming a Celery app or a sink."""

    name = "URL|MODULE:ATTRIBUTE"

    def convert(self, value: object, param: object, ctx: click.Context | None) -> SinkChoice:
        if isinstance(value, SinkChoice):
            return value
        if not isinstance(value, str):
            self.fail(f"{value!r} is no sink: give an amqp:// URL or module:attribute")
        if value.startswith(("amqp://", "amqps://")):
            return SinkChoice(value, url=value)
        found = ImportType().convert(value, param, ctx)
        if callable(getattr(found, "deliver", None)):
            return SinkChoice(value, sink=found)
        if callable(getattr(found, "send_task", None)):  # a Celery app
            from ..maintenance._sinks_shared import require_confirms

            try:
                require_confirms(found)
            except ConfigurationError as exc:
                self.fail(str(exc))
            return SinkChoice(value, app=found)
        self.fail(
            f"{value!r} is neither an amqp:// URL, a Celery app nor a sink (an object with "
            "deliver(store, tx, jobs))"
        )
