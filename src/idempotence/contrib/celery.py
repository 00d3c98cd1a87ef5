"""Celery tasks that run once per key (DESIGN 12), with ``@idempotent_task``.

Celery delivers a task at least once: with late acknowledgement a task whose worker died
is delivered again, and a publisher that retries may send it twice. A task made with
[`idempotent_task`][idempotence.contrib.celery.idempotent_task] is an ``@idempotent``
function ([`idempotence.functions`][idempotence.functions]) registered as a Celery task:
the first delivery of a key runs it and stores its return value; every later delivery
returns the stored value (so the result backend gets the same result) without running it
again.

* The key is a task argument (``key="order_id"``, a dotted path or a callable, as for
  ``@idempotent``), or by default the task's id: the same message delivered again, or
  republished with its id, is the same task.
* Late acknowledgement is on (``acks_late=True``), so a worker that dies before the
  task finished leaves the message to be delivered again.
* A delivery whose key another worker is running (or which a dead worker held until
  its lock lapses) is not run: it is retried later (``Task.retry``, the lock's
  remaining time as its countdown), and so is one that finds the key store
  unreachable. Neither counts against ``max_retries``'s default, which is unlimited
  for these tasks.
* With ``transactional=True`` on a SQL store, the task's writes (through
  ``current_call().tx``) commit with its stored result: a worker killed at any point
  leaves either both or neither.

Open the store in the worker: pass a function that returns it (it is called at the
first task, in the worker's process, after Celery forked it).

Example:
    ```python
    from celery import Celery
    from idempotence import open_store
    from idempotence.contrib.celery import idempotent_task

    app = Celery("shop", broker="amqp://guest:guest@localhost//")

    @idempotent_task(app, lambda: open_store("postgresql://..."), key="order_id")
    def charge(order_id: str, amount: int) -> dict:
        return {"order": order_id, "charged": amount}
    ```
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import Celery, current_task

from ..errors import CallInProgress, StoreUnavailable
from ..functions import idempotent
from ..functions._arguments import Selector
from ..functions.decorator import StoreOrOpener

__all__ = ["idempotent_task", "task_id"]

UNAVAILABLE_RETRY = timedelta(seconds=5)
"""The countdown of a retry after the key store was unreachable."""


def task_id(*args: Any, **kwargs: Any) -> str:
    """The running task's id: the key of a task guarded without ``key=``."""
    task = current_task
    request_id = None if task is None else task.request.id
    if not request_id:
        raise LookupError("task_id() is only available while a Celery task runs")
    return str(request_id)


def idempotent_task(
    app: Celery,
    store: StoreOrOpener,
    *,
    key: Selector | None = None,
    retry_in_progress: timedelta = timedelta(seconds=1),
    guard: dict[str, Any] | None = None,
    **task_options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Register a function as a Celery task that runs once per key.

    Args:
        app: The Celery application.
        store: The key store (a sync one), or better a function without arguments
            that returns it, called in the worker at its first task.
        key: The task argument that identifies the operation (as ``@idempotent``'s
            ``key=``); default: the task's id.
        retry_in_progress: The shortest countdown of a delivery retried because its
            key is running elsewhere.
        guard: More ``@idempotent`` options: ``scope``, ``fingerprint_exclude``,
            ``serializer``, ``final_exceptions``, ``lock_timeout``, ``heartbeat``,
            ``retention``, ``transactional``.
        **task_options: Options for ``app.task`` (``name``, ``queue``...); late
            acknowledgement is on unless ``acks_late=False`` is given.

    Returns:
        The decorator: it returns the Celery task.

    Example:
        ```python
        @idempotent_task(app, open_store, key="order_id", guard={"transactional": True})
        def place(order_id: str) -> int:
            current_call().tx.execute("INSERT INTO orders (ref) VALUES (:ref)", {"ref": order_id})
            return 1
        ```
    """
    options = dict(guard or {})
    task_options.setdefault("acks_late", True)
    task_options.setdefault("max_retries", None)
    floor = retry_in_progress.total_seconds()

    def decorate(fn: Callable[..., Any]) -> Any:
        name = task_options.get("name") or f"{fn.__module__}.{fn.__qualname__}"
        options.setdefault("name", name)
        guarded = idempotent(store, key=key if key is not None else task_id, **options)(fn)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return guarded(*args, **kwargs)
            except CallInProgress as exc:
                # M2: never run twice, never dropped: delivered again once the running
                # call is likely done (or its dead worker's lock has lapsed).
                raise current_task.retry(countdown=max(exc.retry_after, floor)) from exc
            except StoreUnavailable as exc:
                # P11: fail closed; the task waits for the store.
                countdown = UNAVAILABLE_RETRY.total_seconds()
                raise current_task.retry(countdown=countdown, exc=exc) from exc

        return app.task(name=name, **{k: v for k, v in task_options.items() if k != "name"})(run)

    return decorate
