"""Sinks that deliver staged jobs to the queues teams already run (B4, R7, DESIGN 12).

The enqueuer ([`AsyncEnqueuer`][idempotence.maintenance.AsyncEnqueuer]) takes a batch
of staged jobs and hands it to a sink inside the transaction that took them; it commits
only once the sink returned. Both sinks here return only after the broker confirmed
every message of the batch, so a job leaves the outbox only once the broker has it: a
broker that is down, refuses a message or restarts mid-batch makes the sink raise
[`BrokerUnavailable`][idempotence.maintenance.BrokerUnavailable], the transaction
rolls back, and the jobs stay staged. The enqueuer tries again after a backoff that
doubles while the broker stays away (``sink_backoff`` to ``sink_max_backoff`` of
[`EnqueuerConfig`][idempotence.maintenance.EnqueuerConfig]).

A lost confirm (the broker took the message, then the connection broke before it said
so) delivers the job again at the next attempt. Each message carries the job key as its
id, so a consumer guarded by [`idempotence.consumers`][idempotence.consumers] (keyed by
the message id), or a Celery task keyed by its task id, absorbs the duplicate.

* [`AsyncRabbitMQSink`][idempotence.maintenance.sinks_async.AsyncRabbitMQSink]: one
  persistent message per job (``message_id`` = the job key, JSON body = the job's
  arguments), publisher confirms, routed by the job's name.
* [`AsyncCelerySink`][idempotence.maintenance.sinks_async.AsyncCelerySink]:
  ``send_task(job name, task_id=job key)`` per job, on a Celery app whose broker
  confirms publishes.

Example:
    ```python
    enqueuer = AsyncEnqueuer(store, sink=AsyncRabbitMQSink("amqp://guest:guest@localhost//"))
    await enqueuer.run_once()
    ```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._concurrency import call_blocking_async
from ..states import StagedJob
from ..stores import AsyncStore, AsyncTransaction
from ._amqp import AsyncPublisher
from ._sinks_shared import (
    BrokerUnavailable,
    amqp_url,
    not_taken,
    outgoing,
    require_confirms,
    task_call,
)

__all__ = ["AsyncCelerySink", "AsyncRabbitMQSink", "BrokerUnavailable"]


class AsyncRabbitMQSink:
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
        self._publisher = AsyncPublisher(amqp_url(url), timeout)
        self.exchange = exchange
        self.routes = dict(routes or {})
        self.declare = declare and exchange == ""

    async def deliver(
        self, store: AsyncStore, tx: AsyncTransaction, jobs: Sequence[StagedJob]
    ) -> list[str]:
        """Publish ``jobs``; return their keys once the broker confirmed every one.
        [`BrokerUnavailable`][idempotence.maintenance.BrokerUnavailable] when it did
        not: the enqueuer's transaction rolls back and the jobs stay staged."""
        publisher = self._publisher
        messages = [outgoing(job, self.routes) for job in jobs]
        try:
            if self.declare:
                for route in dict.fromkeys(message.route for message in messages):
                    await publisher.declare(route)
            await publisher.publish_all(self.exchange, messages)
        except publisher.errors as exc:
            # The connection may be half dead: the next delivery opens another.
            await self.close()
            raise not_taken("RabbitMQ", len(jobs), exc) from exc
        return [job.job_key for job in jobs]

    async def close(self) -> None:
        """Close the connection (the next delivery opens another)."""
        await self._publisher.close()


class AsyncCelerySink:
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
        require_confirms(app)
        self.app = app
        self.tasks = dict(tasks or {})
        self.queue = queue

    async def deliver(
        self, store: AsyncStore, tx: AsyncTransaction, jobs: Sequence[StagedJob]
    ) -> list[str]:
        """Send ``jobs``; return their keys once the broker confirmed every one.
        [`BrokerUnavailable`][idempotence.maintenance.BrokerUnavailable] when it
        did not."""
        # Celery has no asyncio API: its publish blocks, so an event loop hands the
        # batch to a worker thread.
        await call_blocking_async(self._send, jobs)
        return [job.job_key for job in jobs]

    def _send(self, jobs: Sequence[StagedJob]) -> None:
        try:
            for job in jobs:
                name, args, kwargs = task_call(job, self.tasks)
                self.app.send_task(
                    name,
                    args=args,
                    kwargs=kwargs,
                    task_id=job.job_key,
                    queue=self.queue,
                    retry=False,  # fail now: the jobs stay staged for the next attempt
                )
        except Exception as exc:
            raise not_taken("Celery's broker", len(jobs), exc) from exc
