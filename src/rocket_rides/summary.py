"""The demo's report for people (``idempotence demo`` without ``--json``): every figure
with a legend that says what it counts, the 500s named as the injected faults they are,
and the command that runs the same workload again.

Written for someone who has never read the library's design: no word of its internals
without a plain explanation beside it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from .report import NEVER_CLAIMED, Report

__all__ = ["STATE_LEGEND", "STATUS_LEGEND", "render"]

STATUS_LEGEND = {
    201: "a ride booked, or the replay of its stored answer",
    402: "a declined card: stored, so each retry got the same 402",
    409: "the key was still being worked on (by a twin request, or by a killed worker"
    " until its lock expired): the client waited and retried",
    500: "an injected payment-provider fault (--provider-faults): nothing was stored,"
    " so the client retried with the same key",
}
"""What each HTTP status the clients saw means here (the legend of "answers ...")."""

_BACKENDS = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


def render(report: Report) -> str:
    """The report as a table for people: every figure with a legend that says what it
    counts, in the words of someone who has never read the library's design."""
    n = report.numbers
    lines = [_headline(n), ""]
    lines += _section("Exactly once: each of these must be 0", _invariant_rows(n))
    lines += _section("The rides", _ride_rows(n))
    lines += _section("What was thrown at the service, on purpose", _chaos_rows(n))
    if "messages_published" in n:
        lines += _section("Receipts through RabbitMQ", _message_rows(n))
    rerun = n.get("rerun")
    if rerun:
        lines += ["The same workload again (the same seed):", f"  {rerun}", ""]
    if report.ok:
        # One line (scripts look for "OK:" on the last line).
        lines.append(
            "OK: no double charge, one receipt per paid ride, every answer stored, every"
            " replay identical."
        )
    else:
        lines.append("FAILED:")
        lines += [f"  - {violation}" for violation in report.violations]
    return "\n".join(lines)


def _headline(n: Mapping[str, Any]) -> str:
    backend = _BACKENDS.get(n.get("backend", ""), n.get("backend", "?"))
    workers = n.get("workers", "?")
    head = (
        f"Rocket Rides on {backend}: {n['rides_requested']} rides booked by"
        f" {n.get('clients', '?')} simulated clients through {workers} API"
        f" worker{'s' if workers != 1 else ''}"
    )
    faults = [f"{n.get('crash_rate', 0):.0%} of requests kill the API worker handling them"]
    if "provider_faults" in n:
        faults.append(
            f"each of 3 payment-provider faults (a call dropped before or after charging,"
            f" a 500) hits {n['provider_faults']:.0%} of payment calls"
        )
    head += "; faults injected: " + ", ".join(faults)
    if "broker_queue" in n:
        head += f"; receipts go through RabbitMQ (queue {n['broker_queue']})"
    return "\n".join(textwrap.wrap(head + ".", WIDTH))


_Row = tuple[str, str, str]
"""(label, value, legend)"""

WIDTH = 100
"""The report's width: its legends wrap to it."""


def _section(title: str, rows: list[_Row]) -> list[str]:
    width = max(len(label) for label, _, _ in rows)
    values = max(len(value) for _, value, _ in rows)
    lines = [title]
    for label, value, legend in rows:
        prefix = f"  {label:<{width}}  {value:>{values}}  "
        lines += textwrap.wrap(
            legend,
            WIDTH,
            initial_indent=prefix,
            subsequent_indent=" " * len(prefix),
            break_on_hyphens=False,
        ) or [prefix.rstrip()]
    return [*lines, ""]


def _invariant_rows(n: Mapping[str, Any]) -> list[_Row]:
    return [
        ("double charges", f"{n['double_charges']}", "rides charged more than once"),
        (
            "paid rides without a charge",
            f"{n['rides_without_charge']}",
            "rides marked paid that the provider never charged",
        ),
        ("duplicate receipts", f"{n['duplicate_receipts']}", "paid rides emailed twice"),
        ("missing receipts", f"{n['missing_receipts']}", "paid rides never emailed"),
    ]


STATE_LEGEND = {
    "complete": "answered: the ride's 201 is stored and replayed to any retry",
    "failed": "answered with a stored error, such as a declined card's 402",
    NEVER_CLAIMED: "dropped by their client before the service took them: rightly, no ride",
    "missing": "no record at all, though the service took them (a defect)",
}
"""What each key state at the end means (the legend of "keys ...")."""


def _ride_rows(n: Mapping[str, Any]) -> list[_Row]:
    rows = [
        (
            "rides requested",
            f"{n['rides_requested']}",
            "rides the clients asked for, each under an Idempotency-Key of its own",
        ),
        (
            "rides created",
            f"{n['rides_created']}",
            f"rows in the rides table: {n['rides_paid']} paid,"
            f" {n['rides_declined']} with a declined card",
        ),
        (
            "charges at the provider",
            f"{n['charges']}",
            f"{n['charges_succeeded']} succeeded, {n['charges_declined']} declined",
        ),
        ("receipts sent", f"{n['receipts']}", _receipts_by(n)),
    ]
    rows += [
        (f"keys {state}", f"{count}", STATE_LEGEND.get(state, "not finished (a defect)"))
        for state, count in n["keys_by_state"].items()
    ]
    return rows


def _chaos_rows(n: Mapping[str, Any]) -> list[_Row]:
    answers = [
        (f"answers {code}", f"{count}", STATUS_LEGEND.get(int(code), "not expected here"))
        for code, count in n["responses_by_status"].items()
    ]
    return [
        (
            "API workers killed",
            f"{n['worker_crashes']}",
            f"killed mid-request (SIGKILL), then restarted ({n['restarts']} restarts)",
        ),
        (
            "keys taken over",
            f"{n['lock_takeovers']}",
            "keys a retry resumed once their killed worker's lock expired (a late write by"
            " the old worker would be refused)",
        ),
        (
            "requests sent",
            f"{n['requests']}",
            f"HTTP attempts, retries included: {n['dropped_connections']} connections"
            f" dropped by a killed worker, {n['timeouts']} timeouts,"
            f" {n['concurrent_duplicates']} rides sent twice at once",
        ),
        *answers,
        (
            "replays checked",
            f"{n['replays_checked']}",
            "finished rides asked for again with the same key: each got the same answer",
        ),
        (
            "rides abandoned",
            f"{n['rides_abandoned']}",
            "rides whose client walked away mid-way (the background worker finishes such"
            f" keys: it picked up {n['completer_resumed']} in this run)",
        ),
        (
            "clients out of patience",
            f"{n['clients_gave_up']}",
            "rides whose client ran out of retries",
        ),
        ("wall time", f"{n['wall_time_seconds']:.1f} s", "the whole run, start to end"),
    ]


def _receipts_by(n: Mapping[str, Any]) -> str:
    if "messages_published" in n:
        return "one per paid ride, written by the receipt consumers"
    return (
        "one per paid ride, by the mailer"
        f" ({n['receipt_deliveries_absorbed']} repeated deliveries recognised and skipped)"
    )


def _message_rows(n: Mapping[str, Any]) -> list[_Row]:
    return [
        (
            "messages published",
            f"{n['messages_published']}",
            f"receipt messages sent, {n['duplicates_published']} of them twice on purpose",
        ),
        (
            "messages redelivered",
            f"{n['messages_redelivered']}",
            "delivered again because their consumer was killed holding them",
        ),
        (
            "duplicates absorbed",
            f"{n['duplicates_absorbed']}",
            "copies recognised as already done: acknowledged, nothing written again",
        ),
        ("consumers killed", f"{n['consumers_killed']}", "receipt consumers killed mid-message"),
    ]
