"""Sinks that deliver staged jobs to the queues teams already run (B4, R7, DESIGN 12).

The enqueuer ([`Enqueuer`][idempotence.maintenance.Enqueuer]) takes a batch of
staged jobs and hands it to a sink inside the transaction that took them; it commits
only once the sink returned. Both sinks here return only after the broker confirmed
every message of the batch, so a job leaves the outbox only once the broker has it: a
broker that is down, refuses a message or restarts mid-batch makes the sink raise, the
transaction rolls back, and the jobs stay staged for the next pass (every ``interval``).

A lost confirm (the broker took the message, then the connection broke before it said
so) delivers the job again at the next pass. Each message carries the job key as its id,
so a consumer guarded by [`idempotence.consumers`][idempotence.consumers] (keyed by the
message id), or a Celery task keyed by its task id, absorbs the duplicate.

* [`RabbitMQSink`][idempotence.maintenance.sinks.RabbitMQSink]: one persistent message
  per job (``message_id`` = the job key, JSON body = the job's arguments), publisher
  confirms, routed by the job's name.
* [`CelerySink`][idempotence.maintenance.sinks.CelerySink]: ``send_task(job name,
  task_id=job key)`` per job, on a Celery app whose broker confirms publishes.

Example:
    ```python
    enqueuer = Enqueuer(store, sink=RabbitMQSink("amqp://guest:guest@localhost//"))
    enqueuer.run_once()
    ```
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigurationError
from ..states import StagedJob
from ..stores import Store, Transaction

__all__ = ["BrokerUnavailable", "CelerySink", "RabbitMQSink"]

logger = logging.getLogger("idempotence.maintenance.sinks")


class BrokerUnavailable(ConnectionError):
    """The broker did not confirm a batch of staged jobs: they stay staged, and the next
    pass of the enqueuer delivers them again."""


class RabbitMQSink:
    """Publishes each staged job to RabbitMQ, persistent, with publisher confirms.

    Args:
        url: The broker's AMQP URL (``amqp://user:password@host:5672/%2F``, or with
            ``//`` for the default virtual host, as Celery writes it).
        exchange: The exchange to publish to; default the default exchange, which
            routes by queue name.
        routes: The routing key of each job name; a job name not listed is its own
            routing key (on the default exchange: the queue of that name).
        declare: Declare each routing key as a durable queue before the first publish
            to it (on the default exchange only), so no job is published to nowhere.
        timeout: Seconds to wait for the broker to connect or answer.

    A message the broker cannot route (no queue bound) is refused, not dropped: the
    batch stays staged.
    """

    def __init__(
        self,
        url: str,
        *,
        exchange: str = "",
        routes: Mapping[str, str] | None = None,
        declare: bool = True,
        timeout: float = 10.0,
    ) -> None:
        import pika  # the rabbitmq extra

        self._pika = pika
        parts = urlsplit(url)
        if parts.path == "//":
            # Celery and kombu write the default virtual host "/" as a path of "//";
            # pika reads only its percent-encoded form.
            url = urlunsplit(parts._replace(path="/%2F"))
        self._parameters = pika.URLParameters(url)
        self._parameters.socket_timeout = timeout
        self._parameters.blocked_connection_timeout = timeout
        self._parameters.connection_attempts = 1
        self.exchange = exchange
        self.routes = dict(routes or {})
        self.declare = declare and exchange == ""
        self._connection: Any = None
        self._channel: Any = None
        self._declared: set[str] = set()

    def deliver(self, store: Store, tx: Transaction, jobs: Sequence[StagedJob]) -> list[str]:
        """Publish ``jobs``; return their keys once the broker confirmed every one.
        [`BrokerUnavailable`][idempotence.maintenance.sinks.BrokerUnavailable] when it
        did not: the enqueuer's transaction rolls back and the jobs stay staged."""
        pika = self._pika
        try:
            channel = self._open()
            for job in jobs:
                route = self.routes.get(job.name, job.name)
                if self.declare and route not in self._declared:
                    channel.queue_declare(route, durable=True)
                    self._declared.add(route)
                properties = pika.BasicProperties(
                    message_id=job.job_key,
                    delivery_mode=pika.DeliveryMode.Persistent,
                    content_type="application/json",
                    type=job.name,
                    headers={"idempotence-job": job.name, "idempotence-scope": job.scope},
                )
                # In confirm mode this returns once the broker confirmed the message,
                # and raises if it refused it (nack) or could not route it (mandatory).
                channel.basic_publish(
                    self.exchange, route, json.dumps(job.args).encode(), properties, mandatory=True
                )
        except (pika.exceptions.AMQPError, OSError) as exc:
            self.close()
            raise BrokerUnavailable(
                f"RabbitMQ did not confirm {len(jobs)} staged job(s), which stay staged: {exc!r}"
            ) from exc
        return [job.job_key for job in jobs]

    def _open(self) -> Any:
        if self._channel is None or not self._channel.is_open:
            self.close()
            self._connection = self._pika.BlockingConnection(self._parameters)
            self._channel = self._connection.channel()
            self._channel.confirm_delivery()
            self._declared.clear()
        return self._channel

    def close(self) -> None:
        """Close the connection (the next delivery opens another)."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except Exception as exc:  # it is going away: nothing more to lose
                logger.debug("closing the sink's connection failed: %r", exc)


class CelerySink:
    """Sends each staged job as a Celery task, its task id the job key.

    Args:
        app: The Celery application. Its broker must confirm publishes (for RabbitMQ:
            ``app.conf.broker_transport_options = {"confirm_publish": True}``), or a
            job could leave the outbox before the broker has it; the sink refuses an
            app without.
        tasks: The task name of each job name; a job name not listed is its own
            task name.
        queue: The queue to send to; default the task's own routing.

    A job's arguments are the task's keyword arguments when they are an object, its
    positional arguments when they are a list.
    """

    def __init__(
        self, app: Any, *, tasks: Mapping[str, str] | None = None, queue: str | None = None
    ) -> None:
        options = app.conf.broker_transport_options or {}
        if not options.get("confirm_publish"):
            raise ConfigurationError(
                "CelerySink needs a broker that confirms what it is sent, or staged jobs "
                "could be lost: set app.conf.broker_transport_options = "
                '{"confirm_publish": True}'
            )
        self.app = app
        self.tasks = dict(tasks or {})
        self.queue = queue

    def deliver(self, store: Store, tx: Transaction, jobs: Sequence[StagedJob]) -> list[str]:
        """Send ``jobs``; return their keys once the broker confirmed every one.
        [`BrokerUnavailable`][idempotence.maintenance.sinks.BrokerUnavailable] when it did not."""
        try:
            for job in jobs:
                args, kwargs = ((), job.args) if isinstance(job.args, dict) else (job.args, {})
                self.app.send_task(
                    self.tasks.get(job.name, job.name),
                    args=args,
                    kwargs=kwargs,
                    task_id=job.job_key,
                    queue=self.queue,
                    retry=False,  # fail now: the jobs stay staged for the next pass
                )
        except Exception as exc:
            raise BrokerUnavailable(
                f"Celery's broker did not take {len(jobs)} staged job(s), which stay "
                f"staged: {exc!r}"
            ) from exc
        return [job.job_key for job in jobs]
