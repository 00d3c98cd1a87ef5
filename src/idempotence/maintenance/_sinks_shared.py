"""What the sinks of both flavours share, without I/O (B4): the error a sink raises
when the broker did not take a batch, and how a staged job becomes a RabbitMQ message
or a Celery task. [`AsyncRabbitMQSink`][idempotence.maintenance.AsyncRabbitMQSink] and
[`AsyncCelerySink`][idempotence.maintenance.AsyncCelerySink] are written once
(`sinks_async`), and their sync twins generated from them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigurationError
from ..states import StagedJob

__all__ = ["BrokerUnavailable"]


class BrokerUnavailable(ConnectionError):
    """The broker did not confirm a batch of staged jobs: they stay staged, and the
    enqueuer tries again after a backoff that grows while the failures go on. A sink
    of your own raises it for the same effect."""


def not_taken(broker: str, count: int, exc: BaseException) -> BrokerUnavailable:
    """The error for a batch of ``count`` jobs that ``broker`` did not confirm."""
    return BrokerUnavailable(
        f"{broker} did not confirm {count} staged job(s), which stay staged: {exc!r}"
    )


def amqp_url(url: str) -> str:
    """``url`` with the default virtual host spelled as the AMQP clients read it."""
    parts = urlsplit(url)
    if parts.path == "//":
        # Celery and kombu write the default virtual host "/" as a path of "//"; pika
        # and aio-pika read only its percent-encoded form.
        return urlunsplit(parts._replace(path="/%2F"))
    return url


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One staged job as a persistent RabbitMQ message."""

    route: str
    """The routing key (on the default exchange: the queue)."""
    body: bytes
    """The job's arguments as JSON."""
    message_id: str
    """The job key: a consumer guarded by it absorbs a repeat."""
    type: str
    """The job's name."""
    headers: dict[str, str]


def outgoing(job: StagedJob, routes: Mapping[str, str]) -> Outgoing:
    """``job`` as a message, routed by its name (``routes`` may rename it)."""
    return Outgoing(
        route=routes.get(job.name, job.name),
        body=json.dumps(job.args).encode(),
        message_id=job.job_key,
        type=job.name,
        headers={"idempotence-job": job.name, "idempotence-scope": job.scope},
    )


def require_confirms(app: Any) -> None:
    """Refuse a Celery app whose broker does not confirm publishes."""
    options = app.conf.broker_transport_options or {}
    if not options.get("confirm_publish"):
        raise ConfigurationError(
            "CelerySink needs a broker that confirms what it is sent, or staged jobs "
            "could be lost: set app.conf.broker_transport_options = "
            '{"confirm_publish": True}'
        )


def task_call(job: StagedJob, tasks: Mapping[str, str]) -> tuple[str, Any, Any]:
    """The task name, positional and keyword arguments that ``job`` is sent as: its
    arguments are the keyword arguments when they are an object, the positional ones
    when they are a list."""
    name = tasks.get(job.name, job.name)
    if isinstance(job.args, dict):
        return name, (), job.args
    return name, job.args, {}
