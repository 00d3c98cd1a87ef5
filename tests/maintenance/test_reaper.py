"""B3: the reaper stores a 408 on expired unfinished keys, deletes expired finished
ones, and never touches a live lock or an errored key. Each runs on the sync reaper
and on the async one it is generated from (F7)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from idempotence import KeyState, LockLost, StoredResponse, key_state
from idempotence.flows import Flow
from idempotence.maintenance import Reaper, ReaperConfig, Retention, Signals
from idempotence.problems import Problem, ProblemDetails
from tests.maintenance.support import (
    Backend,
    Flavour,
    claim,
    finished,
    in_threads,
    new_scope,
    pending,
)

FAST = ReaperConfig(batch_pause=0.0)
DAY = timedelta(hours=24)
AGES = ("created_at", "last_run_at", "finished_at", "expires_at")


def age(db: Backend, scope: str, key: str, by: timedelta = timedelta(hours=25)) -> None:
    """Make the key ``by`` older: past a one-day retention."""
    db.backdate(scope, key, by, *AGES)


def test_b3_an_expired_pending_key_gets_a_stored_408(db: Backend, flavour: Flavour) -> None:
    store, scope = db.store, new_scope()
    pending(store, scope, "abandoned")
    age(db, scope, "abandoned")

    result = flavour(Reaper, FAST).run_once()

    assert [k.key for k in result.expired] == ["abandoned"]
    assert result.deleted == 0  # its retention restarted with the 408
    record = store.get(scope, "abandoned")
    assert record is not None and record.response is not None
    assert record.finished and record.error is None
    assert record.response.status == 408
    # F6: stored neutral, with a code of its own; the HTTP profile renders it.
    details = ProblemDetails.from_stored(record.response)
    assert details is not None and details.problem is Problem.REQUEST_EXPIRED
    assert record.expires_at is not None and record.finished_at is not None
    assert record.expires_at - record.finished_at == DAY
    assert key_state(record, record.finished_at) is KeyState.FAILED


def test_b3_an_expired_key_whose_lock_expired_too_is_expired(db: Backend, flavour: Flavour) -> None:
    store, scope = db.store, new_scope()
    zombie = claim(store, scope, "crashed").lease
    age(db, scope, "crashed", timedelta(hours=25))
    db.backdate(scope, "crashed", timedelta(hours=25), "locked_at")

    assert [k.key for k in flavour(Reaper, FAST).run_once().expired] == ["crashed"]
    # The holder's late write is refused: the key is finished.
    assert zombie is not None
    with pytest.raises(LockLost), store.transaction() as tx:
        store.checkpoint(tx, zombie, "charged")
    record = store.get(scope, "crashed")
    assert record is not None and record.response is not None
    assert record.response.status == 408


def test_b3_never_touches_a_live_lock(db: Backend, flavour: Flavour) -> None:
    store, scope = db.store, new_scope()
    claim(store, scope, "running")  # locked for an hour
    db.backdate(scope, "running", timedelta(hours=25), "created_at", "expires_at")

    result = flavour(Reaper, FAST).run_once()

    assert result.expired == ()
    record = store.get(scope, "running")
    assert record is not None
    assert not record.finished and record.locked_at is not None


def test_b3_deletes_expired_finished_keys_only(db: Backend, flavour: Flavour) -> None:
    store, scope = db.store, new_scope()
    for key in ("old-ok", "old-declined"):
        finished(store, scope, key, status=200 if key == "old-ok" else 402)
        age(db, scope, key)
    finished(store, scope, "fresh")
    finished(store, scope, "errored", error="indeterminate foreign failure")
    age(db, scope, "errored")
    finished(store, scope, "ledger", retention=None)
    age(db, scope, "ledger", timedelta(days=3650))

    result = flavour(Reaper, FAST).run_once()

    assert result.deleted == 2
    assert store.get(scope, "old-ok") is None
    assert store.get(scope, "old-declined") is None
    for kept in ("fresh", "errored", "ledger"):
        assert store.get(scope, kept) is not None, kept


def test_b3_retention_is_per_flow(db: Backend, flavour: Flavour) -> None:
    store, scope = db.store, new_scope()
    flows = {
        "day": Flow("day"),
        "three_days": Flow("three_days", retention=Retention.THREE_DAYS),
        "week": Flow("week", retention=Retention.WEEK),
        "ledger": Flow("ledger", retention=Retention.FOREVER),
    }
    for name, flow in flows.items():
        claimed = store.claim(flow.request(scope=scope, key=name, fingerprint="f" * 64))
        assert claimed.lease is not None
        store.finish(claimed.lease, StoredResponse.of(201))
        record = store.get(scope, name)
        assert record is not None
        retention = flow.retention
        if retention is None:
            assert record.expires_at is None
        else:
            assert record.expires_at is not None and record.finished_at is not None
            assert record.expires_at - record.finished_at == retention
        age(db, scope, name, timedelta(hours=80))  # past 24 h and 72 h, not 7 days

    assert flavour(Reaper, FAST).run_once().deleted == 2
    assert {name for name in flows if store.get(scope, name) is not None} == {"week", "ledger"}


def test_b3_empty_database_is_a_no_op(db: Backend, flavour: Flavour) -> None:
    result = flavour(Reaper, FAST).run_once()
    assert (result.expired, result.deleted, result.batches) == ((), 0, 2)


def test_b3_deletes_in_batches_until_a_short_page(db: Backend, flavour: Flavour) -> None:
    store, scope = db.store, new_scope()
    for i in range(25):
        finished(store, scope, f"k{i}")
    db.execute(
        "UPDATE idempotency_keys SET expires_at = created_at WHERE scope = %(scope)s",
        {"scope": scope},
    )
    signals = Signals()
    batches: list[tuple[str, int]] = []
    signals.on("reaper.batch", batches.append)

    result = flavour(
        Reaper, ReaperConfig(batch_size=10, batch_pause=0.0), signals=signals
    ).run_once()

    assert result.deleted == 25
    assert batches == [("expired", 0), ("deleted", 10), ("deleted", 10), ("deleted", 5)]


def test_b3_two_reapers_at_once_split_the_work(db: Backend, flavour: Flavour) -> None:
    store, scope = db.store, new_scope()
    for i in range(60):
        finished(store, scope, f"done-{i}")
        pending(store, scope, f"pending-{i}")
    db.backdate(scope, None, timedelta(hours=25), *AGES)
    config = ReaperConfig(batch_size=7, batch_pause=0.0)
    one, two = flavour(Reaper, config, node=True), flavour(Reaper, config, node=True)

    results = in_threads(one.run_once, two.run_once)

    expired = [k.key for r in results for k in r.expired]
    assert len(expired) == len(set(expired)) == 60
    assert sum(r.deleted for r in results) == 60
    assert db.count("idempotency_keys") == 60  # the 408s, kept for their retention
