"""Natural batching (DESIGN 11), the decisions alone: what goes in a batch, how the
single statements' parameters become the batch's, whose rows are whose, and when a
failed batch is sent again statement by statement. No database here: the batches
on PostgreSQL are tests/test_store_batching.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from idempotence.errors import StoreError, StoreUnavailable, TransientError
from idempotence.stores._sql import batch_plan as _batch
from idempotence.stores._sql.ops import Query


@dataclass
class Entry:
    query: Query
    gone: bool = field(default=False)


def waiting(entry: Entry) -> bool:
    return not entry.gone


def claim(key: str, scope: str = "s") -> Entry:
    return Entry(Query("claim", "", {"scope": scope, "key": key, "fingerprint": f"fp-{key}"}))


def finish(key_id: int) -> Entry:
    return Entry(Query("finish", "", {"scope": "s", "id": key_id, "token": 1, "status": 200}))


def keys(entries: list[Entry]) -> list[str]:
    return [entry.query.params["key"] for entry in entries]


def take(queue: list[Entry], cap: int = _batch.CAP) -> tuple[list[str], list[str]]:
    batch, alone = _batch.take(queue, waiting, cap)
    return keys(batch), keys(alone)


def test_a_batch_takes_everything_waiting_in_arrival_order() -> None:
    queue = [claim("a"), claim("b"), claim("c")]
    assert take(queue) == (["a", "b", "c"], [])
    assert queue == []


def test_a_second_claim_of_a_key_goes_out_alone_beside_the_batch() -> None:
    # ON CONFLICT DO UPDATE cannot change one row twice in a statement; and a retry
    # storm on one key must not go out one batch at a time.
    queue = [claim("a"), claim("b"), claim("a"), claim("c"), claim("a")]
    assert take(queue) == (["a", "b", "c"], ["a", "a"])
    assert queue == []


def test_a_second_finish_of_a_row_goes_out_alone() -> None:
    queue = [finish(1), finish(2), finish(1)]
    batch, alone = _batch.take(queue, waiting)
    assert [e.query.params["id"] for e in batch] == [1, 2]
    assert [e.query.params["id"] for e in alone] == [1]


def test_a_batch_is_capped_and_the_rest_keeps_its_order() -> None:
    queue = [claim(f"k{n}") for n in range(10)]
    assert take(queue, cap=4) == (["k0", "k1", "k2", "k3"], [])
    assert keys(queue) == [f"k{n}" for n in range(4, 10)]
    batch, _ = _batch.take([claim(f"k{n}") for n in range(200)], waiting)
    assert len(batch) == _batch.CAP


def test_a_caller_that_went_away_is_dropped_from_the_queue() -> None:
    queue = [claim("a"), claim("b"), claim("c")]
    queue[1].gone = True
    assert take(queue) == (["a", "c"], [])
    assert queue == []
    # A cancelled claim of a key does not send a live one of it alone.
    queue = [claim("a"), claim("a")]
    queue[0].gone = True
    assert take(queue) == (["a"], [])


def test_the_batch_parameters_are_the_scope_and_one_array_per_parameter() -> None:
    queries = [claim("a").query, claim("b").query]
    assert _batch.params(queries) == {
        "scope": "s",
        "lock_wait": _batch.LOCK_WAIT,
        "key": ["a", "b"],
        "fingerprint": ["fp-a", "fp-b"],
    }


def test_the_rows_go_back_to_their_statements_by_batch_index() -> None:
    rows = [{"batch_index": 3, "id": 30}, {"batch_index": 1, "id": 10}]
    assert _batch.split(rows, 4) == [[{"batch_index": 1, "id": 10}], [], [rows[0]], []]


def test_a_finish_the_batch_returned_no_row_for_is_decided_by_its_own_statement() -> None:
    # finish_batch takes rows by the ctid its snapshot saw: a row updated since then is
    # left unchanged, so an empty answer is not final (F1 is decided alone). A claim's
    # empty answer is its statement's (the claim operation itself runs again then).
    row = [{"batch_index": 1, "id": 10}]
    assert _batch.answered(finish(10).query, row)
    assert not _batch.answered(finish(10).query, [])
    assert _batch.answered(claim("k").query, [])


@pytest.mark.parametrize(
    ("error", "count", "alone"),
    [
        # A value one caller sent that the database refuses: only that caller's.
        (StoreError("PostgreSQL error: invalid byte sequence"), 5, True),
        # The database gone, or a transient abort already retried: everyone's.
        (StoreUnavailable("PostgreSQL is unavailable"), 5, False),
        (TransientError("PostgreSQL aborted the transaction"), 5, False),
        # A batch of one was the statement alone already.
        (StoreError("PostgreSQL error"), 1, False),
    ],
)
def test_a_failed_batch_is_sent_again_alone_only_when_the_error_may_be_one_callers(
    error: Exception, count: int, alone: bool
) -> None:
    assert _batch.alone_after(error, count) is alone
