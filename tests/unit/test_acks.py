"""When the pika adapter acks its settled deliveries together (M1, DESIGN 9): the
decision alone, no broker (the acks on RabbitMQ: tests/consumers/test_rabbitmq.py)."""

from __future__ import annotations

from idempotence.consumers._rabbitmq import Acks


def test_nothing_settled_nothing_to_ack() -> None:
    acks = Acks(prefetch=16)
    assert not acks.due(waiting=0)
    assert acks.take() is None


def test_settled_deliveries_wait_while_more_are_buffered() -> None:
    acks = Acks(prefetch=16)
    for tag in range(1, 8):
        acks.settled(tag)
        assert not acks.due(waiting=5)


def test_half_the_prefetch_pending_acks_up_to_the_last_settled() -> None:
    """The broker stops delivering at the prefetch: the acks go before that."""
    acks = Acks(prefetch=16)
    for tag in range(1, 9):
        acks.settled(tag)
    assert acks.due(waiting=5)
    assert acks.take() == 8
    assert acks.take() is None
    assert not acks.due(waiting=0)


def test_an_empty_buffer_acks_at_once() -> None:
    """Before the adapter waits for the broker, nothing settled stays unacked."""
    acks = Acks(prefetch=16)
    acks.settled(3)
    assert acks.due(waiting=0)
    assert acks.take() == 3


def test_prefetch_one_acks_every_delivery() -> None:
    acks = Acks(prefetch=1)
    acks.settled(1)
    assert acks.due(waiting=1)
    assert acks.take() == 1
