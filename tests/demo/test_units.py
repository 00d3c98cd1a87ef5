"""The demo's pure parts, without a server: request validation, the reconciliation's
rules (it must be able to fail, or it proves nothing), and the small plumbing."""

from __future__ import annotations

import dataclasses
import random
import re
import shlex
import subprocess
import sys
from collections import Counter

import pytest
from click.testing import CliRunner

from idempotence.cli import main
from idempotence.testing import Charge, Fault
from rocket_rides import chaos
from rocket_rides.api import bearer
from rocket_rides.broker import BrokerConfig, Ledger, tally
from rocket_rides.cli import demo
from rocket_rides.clients import ClientStats, Outcome, make_workload
from rocket_rides.mailer import FakeMailer, Receipt
from rocket_rides.provider import Faults
from rocket_rides.report import Evidence, MessageCounts, Report, RideRow, assess
from rocket_rides.rides import ride_params, validate
from rocket_rides.run import DemoOptions, free_port, rerun_command
from rocket_rides.stack import StackConfig
from rocket_rides.summary import render

RIDE = {"origin_lat": 48.88, "origin_lon": 2.35, "target_lat": 48.72, "target_lon": 2.38}

# -- validation ----------------------------------------------------------------------------


def fields_in_error(body: object) -> dict[str, str]:
    return {e.field: e.code for e in validate(ride_params("usr_1", "tok_visa", body))}


def test_a_valid_ride_has_no_errors_and_keeps_only_its_fields():
    params = ride_params("usr_1", "tok_visa", {**RIDE, "origin_lat": 90, "target_lon": "-180"})

    assert validate(params) == []
    assert params == {
        "user": "usr_1",
        "card": "tok_visa",
        **RIDE,
        "origin_lat": 90.0,
        "target_lon": -180.0,
    }


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (None, "parameter_missing"),
        (True, "parameter_invalid"),
        ("north", "parameter_invalid"),
        ("NaN", "parameter_invalid"),
        ("inf", "parameter_invalid"),
        ("1e400", "parameter_invalid"),
        (10**400, "parameter_invalid"),
        (float("inf"), "parameter_invalid"),
        (float("nan"), "parameter_invalid"),
        ([1], "parameter_invalid"),
        ({"a": 1}, "parameter_invalid"),
        (-90.0001, "parameter_invalid"),
        (91, "parameter_invalid"),
    ],
)
def test_a_bad_latitude_is_named(value: object, code: str):
    assert fields_in_error({**RIDE, "origin_lat": value}) == {"origin_lat": code}


def test_unknown_fields_and_non_objects_are_errors():
    assert fields_in_error({**RIDE, "tip\x00": 1}) == {"tip?": "parameter_unknown"}
    assert fields_in_error([RIDE]) == {"body": "parameter_invalid"}
    assert set(fields_in_error({})) == set(RIDE)


def test_bearer():
    assert bearer("Bearer user-1") == "user-1"
    assert bearer("Basic dXNlcg==") is None
    assert bearer("Bearer ") is None


# -- the reconciliation ----------------------------------------------------------------------


def charge(n: int, key: str, status: str = "succeeded") -> Charge:
    return Charge(f"ch_{n}", 2000, "tok_visa", status, f"k{n}", f"usr_1/{key}", 0.0)


def receipt(job: str, ride_id: int) -> Receipt:
    return Receipt(job, ride_id, "usr_1", None, 1, 0.0)


def good_evidence() -> dict:
    workload = make_workload(run="t", rides=3, clients=1, crash_rate=0, declined_rate=0, seed=1)
    keys = [ride.key for ride in workload.rides]
    clients = ClientStats()
    for n, key in enumerate(keys, start=1):
        clients.outcomes[key] = Outcome(201, b'{"id": %d}' % n)
    return {
        "requested": workload.rides,
        "rides": [RideRow(n, key, "charged", f"ch_{n}") for n, key in enumerate(keys, start=1)],
        "charges": [charge(n, key) for n, key in enumerate(keys, start=1)],
        "receipts": [receipt(f"job{n}", n) for n in range(1, 4)],
        "key_states": dict.fromkeys(keys, "complete"),
        "clients": clients,
    }


def test_a_clean_run_is_ok():
    report = assess(Evidence(**good_evidence()))

    assert report.ok, report.violations
    assert report.to_json()["double_charges"] == 0
    assert render(report).splitlines()[-1].startswith("OK")


def broken(change) -> list[str]:
    evidence = good_evidence()
    change(evidence)
    report = assess(Evidence(**evidence))
    assert not report.ok
    assert "FAILED:" in render(report).splitlines()
    return list(report.violations)


def test_the_reconciliation_catches_every_kind_of_defect():
    first = lambda e: e["requested"][0].key  # noqa: E731

    def twice_charged(e):
        e["charges"].append(charge(9, first(e)))

    def orphan_charge(e):
        e["charges"].append(charge(8, "demo-other-00001"))

    def second_ride(e):
        e["rides"].append(RideRow(7, first(e), "created", None))

    def lost_ride(e):
        del e["rides"][0]

    def duplicate_receipt(e):
        e["receipts"].append(receipt("job-again", 1))

    def missing_receipt(e):
        del e["receipts"][0]

    def stuck_key(e):
        e["key_states"][first(e)] = "processing"

    def wrong_answer(e):
        e["clients"].outcomes[first(e)] = Outcome(201, b'{"id": 2}')

    def replay_differs(e):
        e["clients"].replay_mismatches.append(first(e))

    assert broken(twice_charged) == ["1 extra charge(s) for an already charged ride"]
    assert broken(orphan_charge) == ["1 charge(s) without a paid ride"]
    assert "1 ride(s) created twice" in broken(second_ride)
    assert "1 requested ride(s) never created" in broken(lost_ride)
    assert broken(duplicate_receipt) == ["1 duplicate receipt(s)"]
    assert broken(missing_receipt) == ["1 paid ride(s) without a receipt"]
    assert broken(stuck_key) == ["1 key(s) not terminal"]
    assert broken(wrong_answer) == ["1 final answer(s) that disagree with the database"]
    assert broken(replay_differs) == ["1 replay(s) that differed from the first answer"]


def test_a_ride_abandoned_before_its_claim_may_leave_nothing_and_must():
    def abandon_first(evidence: dict, *, keep_ride: bool) -> list[str]:
        key = evidence["requested"][0].key
        evidence["clients"].abandoned.append(key)
        del evidence["clients"].outcomes[key]
        del evidence["key_states"][key]  # the service never kept it
        evidence["charges"] = evidence["charges"][1:]
        evidence["receipts"] = evidence["receipts"][1:]
        if not keep_ride:
            evidence["rides"] = evidence["rides"][1:]
        return list(assess(Evidence(**evidence)).violations)

    assert abandon_first(good_evidence(), keep_ride=False) == []
    assert "1 ride(s) created for a key the service never kept" in abandon_first(
        good_evidence(), keep_ride=True
    )
    # A key the service lost without the client walking away is a defect.
    evidence = good_evidence()
    del evidence["key_states"][evidence["requested"][0].key]
    assert list(assess(Evidence(**evidence)).violations) == ["1 key(s) not terminal"]


def test_the_double_charge_count_adds_extra_and_orphan_charges():
    evidence = good_evidence()
    evidence["charges"] += [charge(9, evidence["requested"][0].key), charge(8, "elsewhere")]

    assert assess(Evidence(**evidence)).numbers["double_charges"] == 2


def test_with_a_broker_the_report_counts_the_messages_and_fails_on_an_unsettled_one():
    counts = dict(published=4, duplicates_published=1, redelivered=2, absorbed=1, unsettled=0)
    report = assess(Evidence(**good_evidence(), messages=MessageCounts(**counts)))

    assert report.ok, report.violations
    numbers = report.to_json()
    assert numbers["messages_published"] == 4 and numbers["duplicates_absorbed"] == 1
    assert numbers["messages_redelivered"] == 2 and numbers["duplicates_published"] == 1
    assert "messages published" in render(report)
    lost = assess(Evidence(**good_evidence(), messages=MessageCounts(**{**counts, "unsettled": 1})))
    assert list(lost.violations) == ["1 published message(s) never settled by a consumer"]
    # Without a broker, the report is as it always was.
    assert "messages_published" not in assess(Evidence(**good_evidence())).to_json()


# -- the report a newcomer reads ---------------------------------------------------------------


def chaotic_report(**messages: int) -> Report:
    """A passing report with every kind of figure: crashes, takeovers, 409s, the
    provider's 500s, a broker if asked."""
    evidence = good_evidence()
    clients = evidence["clients"]
    clients.statuses.update({201: 5, 402: 1, 409: 4, 500: 3})
    clients.requests, clients.dropped, clients.twins = 20, 6, 1
    settings = {
        "backend": "sqlite",
        "clients": 4,
        "workers": 2,
        "crash_rate": 0.1,
        "provider_faults": 0.02,
        "seed": 7,
        "rerun": "idempotence demo --rides 3 --seed 7",
    }
    counts = MessageCounts(**messages) if messages else None
    return assess(
        Evidence(**evidence, takeovers=4, crashes=2, restarts=2, settings=settings, messages=counts)
    )


#: Words of the library's internals that a newcomer cannot read without explanation.
INTERNAL_WORDS = ("lock takeover", "takeovers", "fenced", "lock token", "fencing")


@pytest.mark.parametrize("broker", [False, True], ids=["mailer", "broker"])
def test_every_figure_of_the_report_has_a_legend(broker: bool):
    messages = (
        dict(published=4, duplicates_published=1, redelivered=2, absorbed=1, unsettled=0)
        if broker
        else {}
    )
    text = render(chaotic_report(**messages))

    figures = [line for line in text.splitlines() if re.match(r"  \S.*  +\S+( s)?  \S", line)]
    assert len(figures) >= 15, text
    for line in text.splitlines():
        # A row is "  label  value  legend"; a value alone on its line has no legend.
        assert not re.fullmatch(r"  \S.*?  +[\d.]+( s)?", line), f"no legend: {line!r}"
    for word in INTERNAL_WORDS:
        assert word not in text.lower(), word
    assert all(len(line) <= 100 for line in text.splitlines()[:-1]), text


def test_the_500s_are_named_as_the_injected_provider_faults():
    text = render(chaotic_report())
    (line,) = [line for line in text.splitlines() if line.lstrip().startswith("answers 500")]
    assert "injected payment-provider fault" in line
    assert "--provider-faults" in line
    for status in ("201", "402", "409"):
        assert any(row.lstrip().startswith(f"answers {status}") for row in text.splitlines())


def test_the_report_ends_with_the_command_that_reruns_its_seed():
    lines = render(chaotic_report()).splitlines()
    assert lines[-1].startswith("OK:")
    assert "  idempotence demo --rides 3 --seed 7" in lines


def test_the_rerun_command_gives_back_the_same_options():
    """What the report prints, read back by the demo command itself, is the run's
    options: the ones changed from the defaults, and the seed."""
    options = DemoOptions(
        rides=20, workers=1, crash_rate=0.25, database="sqlite:///x.db", data_dir="/tmp/x"
    )
    command = rerun_command(options, seed=42)
    assert command == (
        "idempotence demo --rides 20 --workers 1 --crash-rate 0.25 --database sqlite:///x.db"
        " --seed 42"
    )
    words = shlex.split(command)[2:]
    with demo.make_context("demo", words) as ctx:
        parsed = {k: v for k, v in ctx.params.items() if k not in ("as_json", "data_dir")}
    assert DemoOptions(**parsed) == dataclasses.replace(options, seed=42, data_dir=None)


def test_the_rerun_command_hides_a_password():
    options = DemoOptions(database="postgresql://app:s3cret@db/app")
    assert rerun_command(options, seed=1) == (
        "idempotence demo --database postgresql://app:PASSWORD@db/app --seed 1"
    )


def test_the_ledger_tally_follows_every_copy(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.write(event="published", ride=1, copies=["a", "b"], duplicates=1)
    ledger.write(event="published", ride=2, copies=["c"], duplicates=0)
    ledger.write(event="settled", id="r1", copy="a", outcome="processed", redelivered=False)
    ledger.write(event="settled", id="r1", copy="b", outcome="in_progress", redelivered=False)
    ledger.write(event="settled", id="r2", copy="c", outcome="processed", redelivered=False)
    # A consumer killed after the commit, before the ack: "c" comes back, absorbed.
    ledger.write(event="settled", id="r2", copy="c", outcome="duplicate", redelivered=True)

    counts = tally(ledger.events(), consumers_killed=1)

    # "b" was requeued, not settled: the run must wait for it.
    assert (counts.published, counts.duplicates_published, counts.unsettled) == (3, 1, 1)
    assert (counts.redelivered, counts.absorbed, counts.consumers_killed) == (1, 1, 1)
    assert counts.rides_published == {1, 2}
    ledger.write(event="settled", id="r1", copy="b", outcome="duplicate", redelivered=False)
    assert tally(ledger.events()).unsettled == 0


# -- plumbing --------------------------------------------------------------------------------


def test_the_mailer_sends_once_per_job(tmp_path):
    mailer = FakeMailer(tmp_path / "mailer.sqlite3")

    assert mailer.send("job-1", ride_id=1, user="usr_1") is True
    assert mailer.send("job-1", ride_id=1, user="usr_1") is False
    assert [(r.job_key, r.deliveries) for r in mailer.receipts()] == [("job-1", 2)]


def test_faults_come_at_their_rates():
    faults = Faults(fail_before_commit=0.1, drop_after_commit=0.2, server_error=0.05)
    rng = random.Random(1)

    counts = Counter(faults.pick(rng) for _ in range(20_000))

    assert counts[Fault.RESET_BEFORE_COMMIT] == pytest.approx(2000, rel=0.1)
    assert counts[Fault.RESET_AFTER_COMMIT] == pytest.approx(4000, rel=0.1)
    assert counts[Fault.SERVER_ERROR] == pytest.approx(1000, rel=0.15)
    assert Faults().pick(rng) is None


def test_the_stack_config_travels_as_json():
    config = StackConfig(
        database="sqlite:////tmp/x.db",
        data_dir="/tmp",
        api_ports=(1, 2),
        provider_port=3,
        faults=Faults(latency=0.1),
    )

    assert StackConfig.from_json(config.to_json()) == config
    with_broker = dataclasses.replace(config, broker=BrokerConfig("amqp://h/", "q", crash_rate=0.2))
    assert StackConfig.from_json(with_broker.to_json()) == with_broker


def test_chaos_headers():
    plan = chaos._plan_of([(b"X-Demo-Crash", b"charge:after"), (b"x-demo-delay", b"99")])

    assert plan is not None
    assert chaos.POINTS[plan.crash_at or 0] == "charge:after"
    assert plan.delay == chaos.MAX_DELAY
    assert chaos._plan_of([(b"x-demo-crash", b"nowhere")]) is None


def test_the_workload_is_the_same_for_the_same_seed():
    make = lambda seed: make_workload(  # noqa: E731
        run="r", rides=50, clients=3, crash_rate=0.1, declined_rate=0.2, seed=seed
    )

    assert make(5) == make(5) != make(6)
    rides = make(5).rides
    assert any(ride.api_key.endswith("-declined") for ride in rides)
    assert any(ride.form for ride in rides)
    assert all(
        ride.scope.replace("usr_", "user-").replace("_", "-") == ride.api_key for ride in rides
    )


def test_the_idempotence_command_has_the_demo():
    runner = CliRunner()

    overview = runner.invoke(main, ["demo", "--help"])
    serve = runner.invoke(main, ["demo", "serve", "--help"])
    wrong = runner.invoke(main, ["demo", "--database", "oracle://x"])

    assert overview.exit_code == 0 and "--crash-rate" in overview.output
    assert serve.exit_code == 0 and "--provider-port" in serve.output
    assert "stack" not in overview.output.split("Commands:")[1]  # internal, hidden
    assert wrong.exit_code == 2 and "unsupported database" in wrong.output


def test_a_bad_or_silent_broker_is_a_clear_error(tmp_path):
    runner = CliRunner()
    nobody = f"amqp://guest:secret@127.0.0.1:{free_port()}/"

    wrong = runner.invoke(main, ["demo", "--broker", "http://127.0.0.1:5672/"])
    silent = runner.invoke(
        main, ["demo", "--rides", "1", "--broker", nobody, "--data-dir", str(tmp_path)]
    )

    assert wrong.exit_code == 2 and "give an AMQP URL" in wrong.output
    assert silent.exit_code == 1 and "no RabbitMQ broker answers at 127.0.0.1" in silent.output
    assert "secret" not in silent.output
    assert not (tmp_path / "processes.log").exists()  # nothing was started


def test_registering_the_group_imports_no_web_stack():
    # The library needs only click; the demo's Starlette, uvicorn and httpx are imported
    # when a demo command runs, not when the idempotence command starts.
    code = (
        "import sys, rocket_rides.cli; "
        "print(sorted(m for m in ('starlette', 'uvicorn', 'httpx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert out.stdout.strip() == "[]"


def test_the_demo_worker_completes_rides_with_the_apis_async_flow_b2_f7(tmp_path):
    """No blocking twin: the worker's completer is the async one, on an async store,
    and resumes the ride flow built with the API's async charger (B2, F7)."""
    import asyncio

    import httpx

    from idempotence import AsyncSqliteStore
    from idempotence.maintenance import AsyncCompleter
    from rocket_rides.rides import FLOW_NAME
    from rocket_rides.stack import background_worker

    config = StackConfig(
        database=f"sqlite:///{tmp_path / 'keys.sqlite3'}",
        data_dir=str(tmp_path),
        api_ports=(8001,),
        provider_port=8002,
    )

    async def build() -> None:
        async with (
            AsyncSqliteStore(str(tmp_path / "keys.sqlite3")) as store,
            httpx.AsyncClient(base_url=config.provider_url) as client,
        ):
            worker = background_worker(config, store, client)
            (completer,) = [s for s in worker.services if s.name == "completer"]
            assert isinstance(completer, AsyncCompleter) and completer.store is store
            assert [flow.name for flow in completer.flows] == [FLOW_NAME]

    asyncio.run(build())


def test_the_keys_by_state_agree_with_the_terminal_check():
    """#16: a report said ``keys by state complete 173, failed 26, missing 1`` just
    above "every key terminal". The "missing" key was one whose client walked away
    before the service claimed it: no row, rightly. It is shown as such, and a key
    that is truly missing (no row, its client did not walk away) fails the check."""
    evidence = good_evidence()
    key = evidence["requested"][0].key
    evidence["clients"].abandoned.append(key)
    del evidence["clients"].outcomes[key]
    del evidence["key_states"][key]
    evidence["rides"], evidence["charges"] = evidence["rides"][1:], evidence["charges"][1:]
    evidence["receipts"] = evidence["receipts"][1:]
    report = assess(Evidence(**evidence))
    assert report.ok, report.violations
    states = report.numbers["keys_by_state"]
    assert states == {"complete": 2, "never claimed": 1}
    text = render(report)
    assert "  keys complete " in text and "  keys never claimed " in text
    assert "keys missing" not in text
    assert "every answer stored" in render(report).splitlines()[-1]

    lost = good_evidence()
    del lost["key_states"][lost["requested"][0].key]
    report = assess(Evidence(**lost))
    assert report.numbers["keys_by_state"] == {"complete": 2, "missing": 1}
    assert list(report.violations) == ["1 key(s) not terminal"]


def test_the_progress_says_a_line_every_few_seconds_off_a_terminal_and_estimates_sanely():
    """#16: off a terminal the demo said nothing until its report; on one, its first
    estimate counted the services' start-up as the first ride's time."""
    from rocket_rides.progress import Progress

    now = [100.0]
    lines: list[str] = []
    progress = Progress(20, tty=False, write=lines.append, every=5.0, clock=lambda: now[0])
    now[0] += 30.0  # the services start: no ride's time
    progress.begin()
    assert lines == ["booking 20 rides"]
    for _ in range(10):  # a ride every 0.5 s
        now[0] += 0.5
        progress()
    assert progress.left(now[0]) == pytest.approx(5.0)  # not 30 s of start-up per ride
    assert lines[1:] == ["booked 10/20 rides in 5 s, about 5 s left"]
    for _ in range(10):
        now[0] += 0.5
        progress()
    assert lines[-1] == "booked 20/20 rides in 10 s"
    assert len(lines) == 3  # begin, every 5 s (the last one is the end)
