"""P11: the breaker's states (stores/postgres/_breaker.py), on a clock of the test's own: how
long a checkout may wait, when it fails at once, when it probes, and the one log line
per outage."""

from __future__ import annotations

import logging
import threading

import pytest

from idempotence.errors import StoreUnavailable
from idempotence.stores.postgres import _breaker
from idempotence.stores.postgres._breaker import FAIL_FAST, PROBE_INTERVAL, Breaker


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(_breaker.time, "monotonic", lambda: now[0])
    return now


def test_an_outage_fails_fast_probes_and_ends(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    breaker = Breaker()
    assert breaker.timeout() == FAIL_FAST and not breaker.troubled  # a slice

    breaker.broken("server closed the connection")
    assert breaker.troubled and breaker.timeout() == FAIL_FAST
    with caplog.at_level(logging.INFO, logger="idempotence.stores"):
        error = breaker.timed_out("no connection in 0.5 s")
        assert isinstance(error, StoreUnavailable) and "no connection" in str(error)
        breaker.down("Connection refused")  # the pool's attempts fail too: still one line
        with pytest.raises(StoreUnavailable, match="Connection refused"):
            breaker.timeout()
        clock[0] += PROBE_INTERVAL
        assert breaker.timeout() == FAIL_FAST  # one probe
        with pytest.raises(StoreUnavailable):
            breaker.timeout()  # and only one
        breaker.healthy()
        breaker.healthy()
    assert not breaker.troubled and breaker.timeout() == FAIL_FAST
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert "unavailable (no connection in 0.5 s)" in lines[0]
    assert "available again" in lines[1]


def test_check_fails_at_once_while_down_and_never_takes_the_probe(clock: list[float]) -> None:
    """What a checkout asks before it queues for its turn to wait."""
    breaker = Breaker()
    breaker.check()  # healthy
    breaker.broken("server closed the connection")
    breaker.check()  # suspect: it may wait (briefly)
    breaker.down("Connection refused")
    with pytest.raises(StoreUnavailable, match="Connection refused"):
        breaker.check()
    clock[0] += PROBE_INTERVAL
    breaker.check()  # a probe is due: let through...
    breaker.check()  # ...without taking it: the checkout's timeout() does
    assert breaker.timeout() == FAIL_FAST
    with pytest.raises(StoreUnavailable):
        breaker.check()


def test_a_deadline_bounds_the_wait(clock: list[float]) -> None:
    breaker = Breaker()
    deadline = breaker.deadline()
    clock[0] += 0.3
    assert breaker.timeout(deadline) == pytest.approx(FAIL_FAST - 0.3)
    clock[0] += 1.0
    assert breaker.timeout(deadline) > 0


def test_the_pools_own_reason_is_the_outages(clock: list[float]) -> None:
    breaker = Breaker("idempotence-test")
    _breaker.connect_errors["idempotence-test"] = "Connection refused"
    breaker.broken("closed")
    error = breaker.timed_out("couldn't get a connection after 0.50 sec")
    assert "Connection refused" in str(error)
    breaker.healthy()
    assert "idempotence-test" not in _breaker.connect_errors


def test_threads_meeting_one_outage_log_it_once() -> None:
    """P11 with the sync store's threads (a worker's services): a second thread that
    finds the server down while the first is still logging it adds no line. The
    handler makes the interleaving certain: it runs the other thread's down() inside
    the first one's warning."""
    breaker = Breaker()
    lines: list[str] = []

    class Interleave(logging.Handler):
        def handle(self, record: logging.LogRecord) -> bool:  # without the handler's lock
            self.emit(record)
            return True

        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
            if len(lines) == 1:
                other = threading.Thread(target=breaker.down, args=("Connection refused",))
                other.start()
                other.join()

    handler = Interleave(logging.INFO)
    logger = logging.getLogger("idempotence.stores")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        breaker.down("Connection refused")
        breaker.healthy()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert [line.split(" (")[0] for line in lines] == [
        "PostgreSQL is unavailable",
        "PostgreSQL is available again",
    ], lines
