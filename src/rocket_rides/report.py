"""The reconciliation (B5): what the clients asked for against what every system did.

Three independent records are compared: Rocket Rides' rides (our database), the
provider's charges (its own database, over its API) and the mailer's receipts (its
own file). Exactly-once holds when:

* every requested ride exists exactly once;
* every paid ride has exactly one successful charge, and that charge is the one the
  ride records; no charge exists without its ride (double charges);
* every paid ride got exactly one receipt, and no unpaid ride got one;
* every key is terminal (``complete`` or ``failed``: a stored answer), but for a
  key whose client walked away before the service claimed it, which has no row
  (counted as ``never claimed``; any other key without a row is ``missing``);
* every client that got a final answer got the ride the database holds, and every
  replay it asked for was the same response;
* with a broker (``--broker``), every message published was settled by a consumer.

`assess` is pure, so the rules are tested without starting anything;
`summary` renders its report for people.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from idempotence.testing.provider import Charge

from .clients import ClientStats, Ride
from .mailer import Receipt

__all__ = ["Evidence", "MessageCounts", "Report", "RideRow", "assess"]

TERMINAL = frozenset({"complete", "failed"})
"""Key states that are a final, stored answer."""
NEVER_CLAIMED = "never claimed"
"""The "state" of a requested key that has no row because its client gave up
before the service claimed it (nothing was booked, as it should be)."""
ACCEPTED = TERMINAL | {NEVER_CLAIMED}


@dataclass(frozen=True, slots=True)
class RideRow:
    """A ride as our database holds it."""

    id: int
    request_key: str
    status: str
    charge_id: str | None


@dataclass(frozen=True, slots=True)
class MessageCounts:
    """What went over the broker (`rocket_rides.broker.tally`)."""

    published: int
    """Copies the broker confirmed, duplicates included."""
    duplicates_published: int
    """Copies published twice on purpose (the chaos run)."""
    redelivered: int
    """Deliveries the broker flagged as redelivered (their consumer died holding them)."""
    absorbed: int
    """Deliveries the guard absorbed: acked, nothing committed."""
    unsettled: int
    """Copies published and never settled by a consumer (lost, or still queued)."""
    rides_published: frozenset[int] = frozenset()
    """The rides whose receipt was published."""
    consumers_killed: int = 0
    """Consumer processes SIGKILLed."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything the reconciliation looks at, gathered after the run."""

    requested: Sequence[Ride]
    rides: Sequence[RideRow]
    charges: Sequence[Charge]
    """The provider's charges for this run's requests."""
    receipts: Sequence[Receipt]
    key_states: Mapping[str, str]
    """Each requested key's state (``missing`` if the key row is gone)."""
    clients: ClientStats
    takeovers: int = 0
    """Lock takeovers on this run's keys (fencing tokens bumped past 1)."""
    completer_resumed: int = 0
    """This run's keys that the completer picked up."""
    crashes: int = 0
    """API workers killed, and processes restarted."""
    restarts: int = 0
    wall_time: float = 0.0
    settings: Mapping[str, Any] = field(default_factory=dict)
    messages: MessageCounts | None = None
    """With a broker: what went over it (None: receipts went to the mailer)."""


@dataclass(frozen=True, slots=True)
class Report:
    """The numbers, and every invariant that failed (empty: all hold)."""

    numbers: dict[str, Any]
    violations: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {**self.numbers, "ok": self.ok, "violations": list(self.violations)}


def _key_of(reference: str | None) -> str | None:
    # Charges carry "<scope>/<key>" as their reference.
    return None if reference is None else reference.rpartition("/")[2]


class _Check(NamedTuple):
    """What one group of invariants counted, and which of them failed."""

    numbers: dict[str, Any]
    violations: list[str]


def _failed(*counts: tuple[int, str]) -> list[str]:
    # One violation per invariant broken, saying how many times.
    return [f"{count} {what}" for count, what in counts if count]


def assess(evidence: Evidence) -> Report:
    """Check every invariant on ``evidence``."""
    clients = evidence.clients
    requested = {ride.key for ride in evidence.requested}
    # A client that walked away before the service claimed its key (the worker was
    # down, or died before the claim committed) booked nothing, and that is right:
    # such a key must have no row, no ride and no charge.
    unclaimed = {
        key for key in clients.abandoned if evidence.key_states.get(key, "missing") == "missing"
    }
    rides_by_key: dict[str, list[RideRow]] = {}
    for ride in evidence.rides:
        rides_by_key.setdefault(ride.request_key, []).append(ride)
    paid = {ride.id: ride for ride in evidence.rides if ride.status == "charged"}

    rides = _check_rides(evidence, requested, unclaimed, rides_by_key, paid)
    charges = _check_charges(evidence, paid)
    receipts = _check_receipts(evidence, paid)
    keys = _check_keys(evidence, requested, unclaimed)
    answers = _check_answers(clients, rides_by_key)
    messages = _check_messages(evidence.messages)
    numbers: dict[str, Any] = {
        **evidence.settings,
        **rides.numbers,
        **charges.numbers,
        **receipts.numbers,
        **keys.numbers,
        "lock_takeovers": evidence.takeovers,
        "worker_crashes": evidence.crashes,
        "restarts": evidence.restarts,
        **answers.numbers,
        **messages.numbers,
        "completer_resumed": evidence.completer_resumed,
        "unexpected_answers": [list(u) for u in clients.unexpected[:10]],
        "wall_time_seconds": round(evidence.wall_time, 2),
    }
    checks = (rides, charges, receipts, keys, answers, messages)
    return Report(numbers, tuple(v for check in checks for v in check.violations))


def _check_rides(
    evidence: Evidence,
    requested: set[str],
    unclaimed: set[str],
    rides_by_key: Mapping[str, list[RideRow]],
    paid: Mapping[int, RideRow],
) -> _Check:
    # Every requested ride exists exactly once, and none for a key never claimed.
    duplicate_rides = sum(len(rows) - 1 for rows in rides_by_key.values())
    missing_rides = sorted(requested - unclaimed - set(rides_by_key))
    unclaimed_rides = sorted(unclaimed & set(rides_by_key))
    declined = [ride for ride in evidence.rides if ride.status == "declined"]
    numbers = {
        "rides_requested": len(requested),
        "rides_never_claimed": len(unclaimed),
        "rides_created": len(evidence.rides),
        "rides_paid": len(paid),
        "rides_declined": len(declined),
    }
    return _Check(
        numbers,
        _failed(
            (len(missing_rides), "requested ride(s) never created"),
            (duplicate_rides, "ride(s) created twice"),
            (len(unclaimed_rides), "ride(s) created for a key the service never kept"),
        ),
    )


def _check_charges(evidence: Evidence, paid: Mapping[int, RideRow]) -> _Check:
    # Every paid ride has exactly one successful charge, the one it records; no
    # charge exists without its ride.
    succeeded = [c for c in evidence.charges if not c.declined]
    by_key = Counter(_key_of(c.reference) for c in succeeded)
    extra_charges = sum(n - 1 for n in by_key.values())
    charged_keys = {ride.request_key for ride in paid.values()}
    without_ride = [c for c in succeeded if _key_of(c.reference) not in charged_keys]
    charge_ids = {c.id for c in succeeded}
    without_charge = [r for r in paid.values() if r.charge_id not in charge_ids]
    numbers = {
        "charges": len(evidence.charges),
        "charges_succeeded": len(succeeded),
        "charges_declined": len(evidence.charges) - len(succeeded),
        "double_charges": extra_charges + len(without_ride),
        "rides_without_charge": len(without_charge),
    }
    return _Check(
        numbers,
        _failed(
            (extra_charges, "extra charge(s) for an already charged ride"),
            (len(without_ride), "charge(s) without a paid ride"),
            (len(without_charge), "paid ride(s) without their charge at the provider"),
        ),
    )


def _check_receipts(evidence: Evidence, paid: Mapping[int, RideRow]) -> _Check:
    # Every paid ride got exactly one receipt, and no unpaid ride got one.
    receipts_by_ride = Counter(r.ride_id for r in evidence.receipts)
    duplicate_receipts = sum(n - 1 for n in receipts_by_ride.values())
    missing_receipts = [ride_id for ride_id in paid if ride_id not in receipts_by_ride]
    unpaid_receipts = [ride_id for ride_id in receipts_by_ride if ride_id not in paid]
    numbers = {
        "receipts": len(evidence.receipts),
        "duplicate_receipts": duplicate_receipts,
        "missing_receipts": len(missing_receipts),
        "receipt_deliveries_absorbed": sum(r.deliveries - 1 for r in evidence.receipts),
    }
    return _Check(
        numbers,
        _failed(
            (duplicate_receipts, "duplicate receipt(s)"),
            (len(missing_receipts), "paid ride(s) without a receipt"),
            (len(unpaid_receipts), "receipt(s) for a ride that was not paid"),
        ),
    )


def _check_keys(evidence: Evidence, requested: set[str], unclaimed: set[str]) -> _Check:
    # Every key the service claimed holds a stored answer. A key whose client walked
    # away before the claim has no row, rightly: it is counted as never claimed, not
    # as missing, so that the states shown are the ones the check accepts.
    states = Counter(
        NEVER_CLAIMED if key in unclaimed else evidence.key_states.get(key, "missing")
        for key in requested
    )
    not_terminal = sum(n for state, n in states.items() if state not in ACCEPTED)
    return _Check(
        {"keys_by_state": dict(sorted(states.items()))},
        _failed((not_terminal, "key(s) not terminal")),
    )


def _check_answers(clients: ClientStats, rides_by_key: Mapping[str, list[RideRow]]) -> _Check:
    # Every final answer is the ride the database holds, and every replay the same.
    numbers = {
        "requests": clients.requests,
        "crash_orders": clients.crash_orders,
        "responses_by_status": {str(k): v for k, v in sorted(clients.statuses.items())},
        "dropped_connections": clients.dropped,
        "timeouts": clients.timeouts,
        "concurrent_duplicates": clients.twins,
        "replays_checked": clients.replays_checked,
        "clients_gave_up": len(clients.gave_up),
        "rides_abandoned": len(clients.abandoned),
    }
    return _Check(
        numbers,
        _failed(
            (len(clients.unexpected), "unexpected answer(s) to clients"),
            (len(clients.replay_mismatches), "replay(s) that differed from the first answer"),
            (
                _answers_disagreeing(clients, rides_by_key),
                "final answer(s) that disagree with the database",
            ),
        ),
    )


def _check_messages(messages: MessageCounts | None) -> _Check:
    # Every copy published, duplicates included, was settled: processed or absorbed.
    if messages is None:
        return _Check({}, [])
    numbers = {
        "messages_published": messages.published,
        "duplicates_published": messages.duplicates_published,
        "messages_redelivered": messages.redelivered,
        "duplicates_absorbed": messages.absorbed,
        "consumers_killed": messages.consumers_killed,
    }
    return _Check(
        numbers, _failed((messages.unsettled, "published message(s) never settled by a consumer"))
    )


def _answers_disagreeing(clients: ClientStats, rides_by_key: Mapping[str, list[RideRow]]) -> int:
    wrong = 0
    for key, outcome in clients.outcomes.items():
        rows = rides_by_key.get(key, [])
        if outcome.status != 201:
            continue
        try:
            ride_id = json.loads(outcome.body)["id"]
        except (ValueError, KeyError, TypeError):
            wrong += 1
            continue
        if [row.id for row in rows] != [ride_id]:
            wrong += 1
    return wrong
