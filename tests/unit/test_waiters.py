"""P10: the listener's bookkeeping, without a database: the payload and the registry
that the sync and the async PostgreSQL listener share."""

from __future__ import annotations

import threading

import pytest

from idempotence.stores._waiters import MAX_PAYLOAD_BYTES, Waiters, notifiable, parse, payload


@pytest.mark.parametrize(
    ("scope", "key"),
    [
        ("acct_1", "k1"),
        ("a:b", "c"),  # a separator in the scope is no ambiguity
        ("a", ":b"),
        ('quo"te\\', 'k"ey'),
        ("tenant ünïcode ✓", "k"),
        ("", "k"),
        ("line\nbreak\x01", "~!@#$%^&*()"),
    ],
)
def test_p10_payload_round_trips(scope: str, key: str) -> None:
    assert parse(payload(scope, key)) == (scope, key)


def test_p10_payload_is_what_postgres_json_build_array_prints() -> None:
    # SELECT json_build_array('acct_1', 'k1')::text
    assert payload("acct_1", "k1") == '["acct_1", "k1"]'


@pytest.mark.parametrize(
    "text", ["", "not json", "[]", '["only-one"]', '["a", "b", "c"]', '["a", 1]', '{"a": "b"}']
)
def test_p10_other_payloads_name_no_key(text: str) -> None:
    assert parse(text) is None


def test_p10_a_scope_too_long_for_a_notify_payload_is_not_notifiable() -> None:
    assert notifiable("acct_1", "k" * 255)
    assert not notifiable("s" * MAX_PAYLOAD_BYTES, "k")
    # Measured in bytes, as PostgreSQL does: a multi-byte scope reaches it sooner.
    assert not notifiable("é" * (MAX_PAYLOAD_BYTES // 2), "k")


def test_p10_a_notification_wakes_every_waiter_of_its_key_once() -> None:
    woken: list[str] = []
    waiters: Waiters[str] = Waiters(woken.append)
    waiters.add("s", "k", "w1")
    waiters.add("s", "k", "w2")
    waiters.add("s", "other", "w3")
    waiters.add("other", "k", "w4")

    assert waiters.notify(payload("s", "k")) == 2
    assert woken == ["w1", "w2"]
    assert waiters.notify(payload("s", "k")) == 0  # woken waiters are gone
    assert len(waiters) == 2


def test_p10_noise_on_the_channel_wakes_nobody() -> None:
    woken: list[str] = []
    waiters: Waiters[str] = Waiters(woken.append)
    waiters.add("s", "k", "w1")
    assert waiters.notify("garbage") == 0
    assert waiters.notify(payload("s", "k2")) == 0
    assert woken == []


def test_p10_a_discarded_waiter_is_not_woken() -> None:
    woken: list[str] = []
    waiters: Waiters[str] = Waiters(woken.append)
    waiters.add("s", "k", "w1")
    waiters.add("s", "k", "w2")
    waiters.discard("s", "k", "w1")
    waiters.discard("s", "k", "w1")  # twice: harmless
    waiters.discard("s", "never", "w9")
    assert waiters.notify(payload("s", "k")) == 1
    assert woken == ["w2"]
    waiters.discard("s", "k", "w2")  # after its wake-up: harmless
    assert len(waiters) == 0


def test_p10_waiters_come_and_go_on_many_threads() -> None:
    events: Waiters[threading.Event] = Waiters(threading.Event.set)
    made = [threading.Event() for _ in range(200)]

    def add(chunk: list[threading.Event]) -> None:
        for event in chunk:
            events.add("s", "k", event)

    threads = [threading.Thread(target=add, args=(made[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert events.notify(payload("s", "k")) == 200
    assert all(event.is_set() for event in made)
