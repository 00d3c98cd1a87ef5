"""The fake provider behaves like a real one: it deduplicates by idempotency key (R4),
declines as an answer, fails the ways networks fail (R6), and keeps what it committed
when its caller is killed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from idempotence.testing import FakeProvider, Fault, IdempotencyKeyReused, ProviderError

KEY = "rides-1-charge"


def test_r4_the_same_key_and_parameters_return_the_first_charge(provider: FakeProvider) -> None:
    first = provider.charge(2000, "tok_visa", idempotency_key=KEY, reference="r")
    again = provider.charge(2000, "tok_visa", idempotency_key=KEY, reference="r")
    assert again == first and first.status == "succeeded"
    assert provider.charges() == [first]
    assert provider.received(idempotency_key=KEY) == 2


def test_r4_the_same_key_with_other_parameters_is_refused(provider: FakeProvider) -> None:
    first = provider.charge(2000, "tok_visa", idempotency_key=KEY)
    with pytest.raises(IdempotencyKeyReused) as refused:
        provider.charge(2500, "tok_visa", idempotency_key=KEY)
    assert refused.value.status == 400 and KEY in str(refused.value)
    assert provider.charges() == [first]


def test_without_a_key_every_call_charges(provider: FakeProvider) -> None:
    provider.charge(2000, "tok_visa")
    provider.charge(2000, "tok_visa")
    assert len(provider.charges()) == 2


def test_r4_racing_calls_with_one_key_make_one_charge(provider: FakeProvider) -> None:
    barrier = threading.Barrier(8)
    charges = []

    def call() -> None:
        barrier.wait()
        charges.append(provider.charge(2000, "tok_visa", idempotency_key=KEY))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({charge.id for charge in charges}) == 1 and len(provider.charges()) == 1


@pytest.mark.parametrize("card", ["declined", "tok_declined"])
def test_r5_a_declined_card_is_an_answer_and_replays(provider: FakeProvider, card: str) -> None:
    declined = provider.charge(2000, card, idempotency_key=KEY)
    assert declined.declined and declined.status == "declined"
    assert provider.charge(2000, card, idempotency_key=KEY) == declined


def test_r6_a_reset_before_commit_charges_nothing(provider: FakeProvider) -> None:
    provider.fail_next(Fault.RESET_BEFORE_COMMIT)
    with pytest.raises(ConnectionResetError):
        provider.charge(2000, "tok_visa", idempotency_key=KEY)
    assert provider.charges() == []
    assert provider.charge(2000, "tok_visa", idempotency_key=KEY).status == "succeeded"


@pytest.mark.parametrize(
    ("fault", "error"),
    [(Fault.RESET_AFTER_COMMIT, ConnectionResetError), (Fault.TIMEOUT_AFTER_COMMIT, TimeoutError)],
)
def test_r6_a_failure_after_commit_charged_and_the_same_key_recovers_it(
    provider: FakeProvider, fault: Fault, error: type[Exception]
) -> None:
    provider.fail_next(fault)
    with pytest.raises(error):
        provider.charge(2000, "tok_visa", idempotency_key=KEY)
    [charged] = provider.charges()
    assert provider.charge(2000, "tok_visa", idempotency_key=KEY) == charged


def test_r6_a_server_error_charges_nothing(provider: FakeProvider) -> None:
    provider.fail_next(Fault.SERVER_ERROR, times=2)
    for _ in range(2):
        with pytest.raises(ProviderError) as failed:
            provider.charge(2000, "tok_visa", idempotency_key=KEY)
        assert failed.value.status == 500
    assert provider.charges() == []
    provider.charge(2000, "tok_visa", idempotency_key=KEY)  # the faults are used up
    assert len(provider.charges()) == 1


def test_latency_delays_every_call(tmp_path: Path) -> None:
    slow = FakeProvider(tmp_path / "slow.sqlite3", latency=0.2)
    started = time.monotonic()
    slow.charge(100, "tok_visa")
    assert time.monotonic() - started >= 0.2


def test_the_commit_hooks_are_on_their_side_of_the_commit(provider: FakeProvider) -> None:
    # What another connection sees from inside each hook: nothing yet, then the charge.
    seen: dict[str, int] = {}
    provider.before_commit = lambda charge: seen.setdefault("before", len(provider.charges()))
    provider.after_commit = lambda charge: seen.setdefault("after", len(provider.charges()))
    provider.charge(2000, "tok_visa", idempotency_key=KEY)
    assert seen == {"before": 0, "after": 1}


@pytest.mark.parametrize(("hook", "kept"), [("before_commit", 0), ("after_commit", 1)])
def test_what_the_provider_committed_survives_the_killing_of_its_caller(
    tmp_path: Path, hook: str, kept: int
) -> None:
    path = tmp_path / "provider.sqlite3"
    FakeProvider(path)
    code = (
        "import os, signal\n"
        "from idempotence.testing import FakeProvider\n"
        f"p = FakeProvider({str(path)!r})\n"
        f"p.{hook} = lambda charge: os.kill(os.getpid(), signal.SIGKILL)\n"
        "p.charge(2000, 'tok_visa', idempotency_key='k')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == -9, done.stderr
    assert len(FakeProvider(path).charges()) == kept
