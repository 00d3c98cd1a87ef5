"""What a handler step works out once and looks up on every run: the heartbeat's
period by lock timeout, and the headers kept for the last headers sent. A lookup
must give what working it out again would, whatever the runs before."""

from __future__ import annotations

from datetime import timedelta

from idempotence.flows import Captured
from idempotence.flows.steps import HandlerStep
from idempotence.states import StoredResponse


def step(heartbeat: timedelta | None = None) -> HandlerStep:
    return HandlerStep("handler", 1024, frozenset(), frozenset({"content-type"}), heartbeat)


def test_the_heartbeat_period_follows_each_lock_timeout_and_the_step_heartbeat() -> None:
    default = step()
    assert default.beat_every(timedelta(seconds=30)) == 10.0
    assert default.beat_every(timedelta(seconds=30)) == 10.0  # looked up
    assert default.beat_every(timedelta(seconds=9)) == 3.0  # another lock: its own
    fixed = step(timedelta(seconds=2))
    assert fixed.beat_every(timedelta(seconds=30)) == fixed.beat_every(timedelta(seconds=9)) == 2.0


def test_the_headers_kept_are_those_of_the_answer_stored_whatever_came_before() -> None:
    one = step()
    sent = (("Content-Type", "application/json"), ("x-trace", "1"))
    json = StoredResponse(200, (("content-type", "application/json"),), b"{}")
    assert one.stored(Captured(200, sent, b"{}")) == json
    assert one.stored(Captured(200, sent, b"{}")) == json  # the same tuple: looked up
    other = (("content-type", "text/plain"),)
    assert one.stored(Captured(201, other, b"a")).headers == other  # another: worked out
    # A list the app changes between answers is worked out again every time.
    headers = [("content-type", "text/csv")]
    assert one.stored(Captured(200, headers, b"")).headers == (("content-type", "text/csv"),)  # type: ignore[arg-type]
    headers[0] = ("x-other", "1")
    assert one.stored(Captured(200, headers, b"")).headers == ()  # type: ignore[arg-type]
    assert one.stored(Captured(200, sent, b"{}")) == json
    # Equal steps are equal whatever their memos hold.
    assert one == step() and hash(one) == hash(step())
