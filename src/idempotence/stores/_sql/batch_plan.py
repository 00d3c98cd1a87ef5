"""Natural batching of autocommit statements (DESIGN 11): the decisions, without I/O.

While a claim (or a finish) of a scope is on its way to the database, the next ones
of that scope wait; when it is back, everything that waited goes out as one
statement (``claim_batch``, ``finish_batch`` in the dialect's queries), and each
caller gets its own row back. This module decides what goes in a batch, how the
single statements' parameters become the batch's, and whose rows are whose. The
waiting itself is `batcher`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from ...errors import StoreUnavailable, TransientError

Row = dict[str, Any]
"""A row as the stores return it (``ops.Row``; not imported: ``ops`` imports this)."""


class Query(Protocol):
    """What a batch reads of a statement (``ops.Query``)."""

    @property
    def name(self) -> str: ...

    @property
    def params(self) -> Mapping[str, Any]: ...


CAP = 64
"""The most statements one batch carries: a bound on the statement's size and on the
time its row locks are held, far above what a pool of connections keeps waiting."""

LOCK_WAIT = "50ms"
"""How long a batch statement waits for a row lock before it gives up and its
statements go again one by one (see ``claim_batch``): a key held by another open
transaction must not hold up the batch's other callers, nor the lane behind them.
Long enough for a statement of a concurrent batch on the same keys to commit."""

BATCH_INDEX = "batch_index"
"""The column of a batch statement's rows that says whose row it is (1-based, the
order of the queries in the batch)."""

ROW = {"claim": "key", "finish": "id"}
"""Per statement that batches, the parameter naming its row within a scope: two
statements of one batch must never touch the same row (PostgreSQL's ON CONFLICT
DO UPDATE cannot change a row twice in one statement, and an UPDATE ... FROM would
apply only one of two), so a second one goes out alone (see `take`)."""


class Waiting(Protocol):
    """A statement waiting to go out in a batch."""

    @property
    def query(self) -> Query: ...


W = TypeVar("W", bound=Waiting)


def take(queue: list[W], waiting: Callable[[W], bool], cap: int = CAP) -> tuple[list[W], list[W]]:
    """Take the next batch out of ``queue`` (oldest first): at most ``cap`` of the
    statements still ``waiting`` (a caller that went away is dropped), never two for
    one row; what is left past the cap stays queued, in order. Second statements for
    a row in the batch come back apart: they go out alone, at once, beside the batch
    (duplicates of one key, a retry storm, keep the concurrency they had without
    batching instead of going out one batch at a time)."""
    batch: list[W] = []
    alone: list[W] = []
    rows: set[Any] = set()
    kept: list[W] = []
    for entry in queue:
        if not waiting(entry):
            continue
        query = entry.query
        row = query.params[ROW[query.name]]
        if row in rows:
            alone.append(entry)
        elif len(batch) < cap:
            rows.add(row)
            batch.append(entry)
        else:
            kept.append(entry)
    queue[:] = kept
    return batch, alone


def params(queries: Sequence[Query]) -> dict[str, Any]:
    """The batch statement's parameters: the scope the queries share, its bound on
    lock waits, and one array per other parameter of the single statement, in the
    queries' order."""
    first = queries[0].params
    batched: dict[str, Any] = {"scope": first["scope"], "lock_wait": LOCK_WAIT}
    for name in first:
        if name != "scope":
            batched[name] = [query.params[name] for query in queries]
    return batched


EMPTY_NOT_FINAL = {"finish"}
"""The statements whose batch may leave unchanged a row their single statement would
have changed: finish_batch takes each row by the ctid of the version its snapshot
saw (see queries.sql), and a row updated after that snapshot (a duplicate marking
itself a waiter, P10) is then not updated at all. So such a statement with no row
back goes out again alone (see `answered`)."""


def answered(query: Query, rows: list[Row]) -> bool:
    """Whether ``rows``, what a batch returned for ``query``, are its answer, as they
    would have been alone. Else its single statement decides, sent alone: a finish
    with a stale lock token (F1) then matches no row again, and only then is its
    caller refused."""
    return bool(rows) or query.name not in EMPTY_NOT_FINAL


def split(rows: list[Row], count: int) -> list[list[Row]]:
    """The batch statement's ``rows`` as each of ``count`` statements would have had
    them: by `BATCH_INDEX`, none for a statement no row came back for."""
    mine: list[list[Row]] = [[] for _ in range(count)]
    for row in rows:
        mine[row[BATCH_INDEX] - 1].append(row)
    return mine


def alone_after(error: Exception, count: int) -> bool:
    """Whether the ``count`` statements of a batch that failed with ``error`` should
    each be sent again alone: yes when the error may be one statement's own (a value
    the database refuses), since then only that statement's caller must get it; no
    when it is the database's (unavailable, or a transient abort the store already
    retried), which each statement alone would meet too. A failed batch changed
    nothing (one statement in autocommit), so sending again is safe."""
    return count > 1 and not isinstance(error, StoreUnavailable | TransientError)
