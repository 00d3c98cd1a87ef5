"""B1: the sweeper releases expired locks and bumps the fencing token. Each test that
takes ``flavour`` runs on the sync sweeper and on the async one it is generated from
(F7)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from idempotence import ConfigurationError, KeyState, LockLost, key_state
from idempotence.maintenance import Signals, Sweeper, SweeperConfig
from tests.maintenance.support import (
    EXPIRED,
    Backend,
    Flavour,
    claim,
    finished,
    in_threads,
    new_scope,
)

FAST = SweeperConfig(batch_pause=0.0, interval=0.05)


def test_b1_unlocks_expired_locks_and_bumps_the_token(db: Backend, flavour: Flavour) -> None:
    store, scope = db.store, new_scope()
    crashed = [claim(store, scope, f"crashed-{i}", lock_timeout=EXPIRED) for i in range(3)]
    live = claim(store, scope, "live")
    finished(store, scope, "done")
    time.sleep(0.02)

    result = flavour(Sweeper, FAST).run_once()

    assert sorted(k.key for k in result.swept) == ["crashed-0", "crashed-1", "crashed-2"]
    assert {k.lock_token for k in result.swept} == {2}
    for c in crashed:
        record = store.get(scope, c.record.key)
        assert record is not None
        assert record.locked_at is None
        assert record.lock_token == 2
        assert key_state(record, record.created_at) is KeyState.PENDING
    live_record = store.get(scope, "live")
    assert live_record is not None
    assert live_record.lock_token == 1
    assert live_record.locked_at == live.record.locked_at


def test_b1_a_zombies_late_checkpoint_is_refused(db: Backend, flavour: Flavour) -> None:
    """F1: the crashed holder comes back after the sweep; its phase cannot commit."""
    store, scope = db.store, new_scope()
    zombie = claim(store, scope, "k", lock_timeout=EXPIRED).lease
    assert zombie is not None
    time.sleep(0.02)
    assert flavour(Sweeper, FAST).run_once().count == 1

    with pytest.raises(LockLost), store.transaction() as tx:
        store.checkpoint(tx, zombie, "charged")
    record = store.get(scope, "k")
    assert record is not None
    assert record.recovery_point == "started"


def test_b1_p10_sweeping_a_lock_wakes_the_duplicates_waiting_for_it(pg_db: Backend) -> None:
    """P10: the sweeper's unlock settles the key like a release, so a duplicate waiting
    for the crashed holder is woken by its NOTIFY (and can take the key over) rather
    than at the end of its pause."""
    store, scope = pg_db.store, new_scope()
    claim(store, scope, "crashed", lock_timeout=timedelta(minutes=5))
    waited: list[float] = []

    def wait() -> None:
        started = time.monotonic()
        store.wait_for_settle(scope, "crashed", 10.0)
        waited.append(time.monotonic() - started)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    deadline = time.monotonic() + 10
    while (pg_db.row(scope, "crashed") or {}).get("waiters") is not True:
        assert time.monotonic() < deadline, "the waiter never marked the key"
        time.sleep(0.01)
    pg_db.backdate(scope, "crashed", timedelta(minutes=10), "locked_at")  # the holder died

    assert Sweeper(store, FAST).run_once().count == 1

    waiter.join(timeout=20)
    assert waited and waited[0] < 5
    assert (pg_db.row(scope, "crashed") or {}).get("waiters") is False


def test_b1_empty_database_is_a_no_op(db: Backend, flavour: Flavour) -> None:
    result = flavour(Sweeper, FAST).run_once()
    assert result.count == 0
    assert result.batches == 1


def test_b1_works_in_batches_until_a_short_page(db: Backend, flavour: Flavour) -> None:
    store, scope = db.store, new_scope()
    for i in range(25):
        claim(store, scope, f"k{i}", lock_timeout=EXPIRED)
    time.sleep(0.02)
    signals = Signals()
    sizes: list[int] = []
    signals.on("sweeper.batch", lambda payload: sizes.append(payload[1]))

    result = flavour(
        Sweeper, SweeperConfig(batch_size=10, batch_pause=0.0), signals=signals
    ).run_once()

    assert result.batches == 3
    assert sizes == [10, 10, 5]
    assert result.count == 25


def test_b1_max_batches_bounds_a_pass(db: Backend, flavour: Flavour) -> None:
    store, scope = db.store, new_scope()
    for i in range(25):
        claim(store, scope, f"k{i}", lock_timeout=EXPIRED)
    time.sleep(0.02)
    config = SweeperConfig(batch_size=10, batch_pause=0.0, max_batches=2)
    assert flavour(Sweeper, config).run_once().count == 20
    assert flavour(Sweeper, config).run_once().count == 5


def test_b1_two_sweepers_at_once_never_sweep_a_key_twice(db: Backend, flavour: Flavour) -> None:
    scope = new_scope()
    for i in range(60):
        claim(db.store, scope, f"k{i}", lock_timeout=EXPIRED)
    time.sleep(0.02)
    config = SweeperConfig(batch_size=5, batch_pause=0.0)
    one, two = flavour(Sweeper, config, node=True), flavour(Sweeper, config, node=True)

    results = in_threads(one.run_once, two.run_once)

    keys = [k.key for result in results for k in result.swept]
    assert len(keys) == len(set(keys)) == 60
    tokens = db.execute("SELECT DISTINCT lock_token FROM idempotency_keys")
    assert tokens == [{"lock_token": 2}]  # each key bumped exactly once


def test_b1_run_forever_sweeps_until_stopped(db: Backend, flavour: Flavour) -> None:
    store, scope = db.store, new_scope()
    signals = Signals()
    stop = threading.Event()
    sweeper = flavour(Sweeper, FAST, signals=signals)
    thread = threading.Thread(target=sweeper.run_forever, args=(stop,))
    thread.start()
    try:
        signals.wait("sweeper.pass")
        claim(store, scope, "late", lock_timeout=EXPIRED)
        deadline = time.monotonic() + 10
        while (record := store.get(scope, "late")) and record.locked_at is not None:
            assert time.monotonic() < deadline, "the running sweeper never swept the key"
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    signals.wait("sweeper.stopped", timeout=1)


def test_b1_a_long_interval_does_not_delay_the_stop(db: Backend, flavour: Flavour) -> None:
    signals = Signals()
    stop = threading.Event()
    sweeper = flavour(Sweeper, SweeperConfig(interval=3600), signals=signals)
    thread = threading.Thread(target=sweeper.run_forever, args=(stop,))
    thread.start()
    signals.wait("sweeper.pass")
    started = time.monotonic()
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    "settings",
    [
        {"batch_size": 0},
        {"interval": 0},
        {"batch_pause": -1},
        {"jitter": 1.0},
        {"query_timeout": 0},
        {"max_batches": 0},
    ],
)
def test_config_rejects_values_that_cannot_work(settings: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match=next(iter(settings))):
        SweeperConfig(**settings)  # type: ignore[arg-type]


def test_config_has_named_defaults() -> None:
    config = SweeperConfig()
    assert config.batch_size == 100
    assert config.interval == 30.0
    assert config.query_timeout == 30.0
