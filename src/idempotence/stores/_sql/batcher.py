"""Natural batching of autocommit statements (DESIGN 11): the waiting, in both
spellings (the sync one passes every statement straight through).

The first statement of a lane (a kind and a scope: see `batch_plan.lane`) goes out
at once, exactly as without batching: an idle store adds no wait. Statements that
arrive while one of their lane is on its way queue up; when it is back, one task
sends the whole queue as one statement (up to `batch_plan.CAP`; a second
statement for a row in it goes out alone beside it), then the queue that formed
meanwhile, until the lane is idle again. This is the leader/follower
pattern of River's batched job completer: the batches grow with the load and no
timer ever delays a statement.

Each caller keeps its own operation (`ops`): it hands the batch its first
statement and gets that statement's rows back, so its outcome, its fence (F1) and its
error are decided by its own code, as alone. An operation that wants a second
statement (a claim that met a row committed after its snapshot) runs again alone, and
so does a finish the batch returned no row for (`batch_plan.answered`).
An error of the batch statement that any statement in it would have met (the
database gone, a transient abort retried to the end) reaches every caller in it, the
error the single statement would have raised (each caller its own copy, the batch's
error its ``__cause__``); any other error (a value one
caller sent that the database refuses) sends each caller's statement again alone, so
that only the caller at fault gets it. A caller cancelled while it waits leaves the
batch (or, once the statement is out, just does not read its rows).

The task that sends the batches runs in a context of its own, empty: it serves every
caller in its lane, so it must not carry the context of the caller that happened to
start it (its trace span, its log fields). What each caller reports (its claim's
watch, a refused fenced write) it reports from its own task, in its own context.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from . import batch_plan as _batch
from .ops import Op, Query, Row
from .retry import own_copy

T = TypeVar("T")

AsyncAlone = Callable[[Callable[[], Op[Any]]], Awaitable[Any]]
"""Run an operation in a transaction of its own (the store's ``_own``)."""
Alone = Callable[[Callable[[], Op[Any]]], Any]
AsyncSend = Callable[[list[Query]], Awaitable[list[list[Row]]]]
"""Send a batch of statements of one lane; the rows of each, in order."""
Send = Callable[[list[Query]], list[list[Row]]]


@dataclass(slots=True)
class _Waiter:
    query: Query
    rows: asyncio.Future[list[Row] | None]
    """The statement's rows; None when the batch failed in a way that each of its
    statements alone might not (see `batch_plan.alone_after`)."""


def _waiting(waiter: _Waiter) -> bool:
    return not waiter.rows.done()


class AsyncBatcher:
    """Batches the statements of callers that arrive while one of their lane is out."""

    def __init__(self, alone: AsyncAlone, send: AsyncSend, cap: int = _batch.CAP) -> None:
        self._alone = alone
        self._send = send
        self._cap = cap
        #: Per busy lane, the statements waiting for the next batch. A lane is busy
        #: (present) from its first statement until a batch finds nothing to send.
        self._lanes: dict[tuple[str, str], list[_Waiter]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, kind: str, scope: str, make_op: Callable[[], Op[T]]) -> T:
        """Run the operation ``make_op`` makes: alone and at once when its lane is
        idle, else its first statement in the lane's next batch."""
        lane = (kind, scope)
        queue = self._lanes.get(lane)
        if queue is None:
            self._lanes[lane] = queue = []
            try:
                result: T = await self._alone(make_op)
                return result
            finally:
                self._next(lane, queue)
        op = make_op()
        waiter = _Waiter(next(op), asyncio.get_running_loop().create_future())
        queue.append(waiter)
        rows = await waiter.rows
        if rows is not None:
            try:
                op.send(rows)
            except StopIteration as done:
                settled: T = done.value
                return settled
        op.close()
        # A second statement for a row in the batch, a batch that failed for something
        # in it, or one statement that did not settle the operation (see
        # claim_in_one_statement): start over alone.
        again: T = await self._alone(make_op)
        return again

    def _next(self, lane: tuple[str, str], queue: list[_Waiter]) -> None:
        if not any(_waiting(waiter) for waiter in queue):
            del self._lanes[lane]
            return
        # In an empty context: ensure_future would copy the current one, the context
        # of the caller whose statement just came back, into a task that serves the
        # others.
        task = asyncio.get_running_loop().create_task(
            self._drain(lane, queue), context=contextvars.Context()
        )
        self._tasks.add(task)  # the loop holds tasks weakly
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, lane: tuple[str, str], queue: list[_Waiter]) -> None:
        batch: list[_Waiter] = []
        try:
            while True:
                batch, alone = _batch.take(queue, _waiting, self._cap)
                for waiter in alone:
                    waiter.rows.set_result(None)
                if not batch:
                    break
                try:
                    rows = await self._send([waiter.query for waiter in batch])
                except Exception as exc:
                    again = _batch.alone_after(exc, len(batch))
                    for waiter in batch:
                        if not _waiting(waiter):
                            continue
                        if again:
                            waiter.rows.set_result(None)
                        else:
                            waiter.rows.set_exception(own_copy(exc))
                    continue
                for waiter, mine in zip(batch, rows, strict=True):
                    if _waiting(waiter):
                        answer = mine if _batch.answered(waiter.query, mine) else None
                        waiter.rows.set_result(answer)
        except BaseException:
            # Cancelled (the loop is closing): nobody is left to send for them.
            for waiter in batch + queue:
                waiter.rows.cancel()
            raise
        finally:
            del self._lanes[lane]


class Batcher:
    """The sync store's: every statement goes out alone (a thread waiting for a batch
    would hold its own connection idle, which is what batching saves). It takes
    ``send`` only because the sync store is generated from the async one, which
    passes it."""

    def __init__(self, alone: Alone, send: Send) -> None:
        self._alone = alone

    def run(self, kind: str, scope: str, make_op: Callable[[], Op[T]]) -> T:
        result: T = self._alone(make_op)
        return result
