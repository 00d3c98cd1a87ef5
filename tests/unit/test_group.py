"""Group commit's bookkeeping, without a database (:mod:`idempotence.stores.sqlite._group`):
which writes go into the next commit, and who commits it."""

from __future__ import annotations

import pytest

from idempotence.stores.sqlite._group import MAX_GROUP, Groups


def test_a_lone_write_is_committed_at_once_by_its_own_caller() -> None:
    groups: Groups[str] = Groups()
    assert groups.arrive("a") is True
    assert groups.take() == ["a"]
    assert groups.done() is None
    # Idle again: the next write goes at once too.
    assert groups.arrive("b") is True


def test_a_lone_write_may_lead_without_queueing_and_later_writes_wait_for_it() -> None:
    groups: Groups[str] = Groups()
    assert groups.lead() is True
    assert groups.lead() is False  # one commit at a time
    assert groups.arrive("b") is False
    # The lone leader's write was never queued: the next group is what waited.
    assert groups.done() == "b"
    assert groups.take() == ["b"]
    assert groups.done() is None
    assert groups.lead() is True


def test_writes_arriving_during_a_commit_wait_and_go_together_in_the_next() -> None:
    groups: Groups[str] = Groups()
    assert groups.arrive("a") is True
    assert groups.take() == ["a"]  # in flight
    assert [groups.arrive(w) for w in "bcd"] == [False, False, False]
    assert len(groups) == 3
    # The first of them commits the next group: all three, oldest first.
    assert groups.done() == "b"
    assert groups.take() == ["b", "c", "d"]
    assert groups.done() is None
    assert len(groups) == 0


def test_a_write_arriving_while_the_next_leader_is_being_woken_joins_its_group() -> None:
    groups: Groups[str] = Groups()
    groups.arrive("a")
    groups.take()
    groups.arrive("b")
    assert groups.done() == "b"
    # Still busy between done() and the new leader's take(): nobody else leads.
    assert groups.arrive("c") is False
    assert groups.take() == ["b", "c"]


def test_a_group_is_bounded_and_the_rest_go_in_the_next() -> None:
    groups: Groups[int] = Groups(limit=3)
    groups.arrive(0)
    groups.take()
    for n in range(1, 8):
        assert groups.arrive(n) is False
    assert groups.done() == 1
    assert groups.take() == [1, 2, 3]
    assert groups.done() == 4
    assert groups.take() == [4, 5, 6]
    assert groups.done() == 7
    assert groups.take() == [7]
    assert groups.done() is None


def test_the_default_bound() -> None:
    groups: Groups[int] = Groups()
    groups.arrive(-1)
    groups.take()
    for n in range(MAX_GROUP + 5):
        groups.arrive(n)
    groups.done()
    assert len(groups.take()) == MAX_GROUP
    assert len(groups) == 5


def test_misuse_is_refused() -> None:
    groups: Groups[str] = Groups()
    with pytest.raises(RuntimeError):
        groups.take()
    with pytest.raises(RuntimeError):
        groups.done()
    with pytest.raises(ValueError, match="at least one"):
        Groups(limit=0)
