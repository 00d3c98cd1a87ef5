"""Clock skew between app hosts (DESIGN 3, DESIGN 13; issue 35 item 7): the lock
arithmetic runs on the store's clock, so an app host whose clock is minutes off takes
over a key neither early nor late.

Each claim runs in its own process with its clock moved (tests/network/skewed.py): a
worker 10 minutes ahead claims the key and dies holding the lock; workers 10 minutes
behind and ahead then try. Until the lock lapses on the store's clock they are told
IN_PROGRESS (no early takeover, which a clock running ahead would cause); once it
lapses the next takes over (no late takeover, which a clock running behind would
delay by the skew).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from .hosts import ROOT

LOCK = 4.0  # long enough for three claims, each a new process, on a loaded machine
SKEW = 600.0  # ten minutes


def claim(shift: float, url: str, prefix: str, key: str) -> tuple[str, float]:
    """The outcome of a claim made under a clock moved by ``shift`` seconds, and when
    the claim was answered (this process's monotonic clock)."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.network.skewed", str(shift), url, prefix, key, str(LOCK)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), time.monotonic()


@pytest.fixture(params=["postgres", "redis"])
def target(request: pytest.FixtureRequest) -> tuple[str, str]:
    if request.param == "postgres":
        return request.getfixturevalue("pg_url"), ""
    return request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")


def test_a_skewed_app_host_takes_over_neither_early_nor_late(target: tuple[str, str]) -> None:
    url, prefix = target
    key = f"skew-{uuid.uuid4().hex}"
    outcome, claimed = claim(+SKEW, url, prefix, key)
    assert outcome == "execute"
    # Early: another host, behind or ahead, finds the lock live however its clock reads.
    checked = 0
    for shift in (-SKEW, +SKEW, 0.0):
        outcome, at = claim(shift, url, prefix, key)
        if at - claimed < LOCK * 0.8:  # the claim must still be within the lock
            assert outcome == "in_progress", f"taken over early by a host {shift:+g} s off"
            checked += 1
    # A machine too slow to claim within the lock checked nothing: say so, never pass.
    assert checked, f"no skewed claim landed within {LOCK * 0.8:g} s of the first"
    # Late: once the lock lapses on the store's clock, a host 10 minutes behind takes
    # over within a bounded poll, not 10 minutes later.
    deadline = claimed + LOCK + 10.0
    while time.monotonic() < deadline:
        outcome, at = claim(-SKEW, url, prefix, key)
        if outcome == "execute":
            assert at - claimed >= LOCK * 0.9, "taken over before the lock lapsed"
            return
        assert outcome == "in_progress"
    pytest.fail(
        f"no takeover within {LOCK + 10.0:g} s of a {LOCK:g} s lock by a host {SKEW:g} s behind"
    )
