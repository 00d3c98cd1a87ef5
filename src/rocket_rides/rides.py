"""The ride flow: create the ride, charge $20, stage the receipt (DESIGN 5).

::

    started ──▶ ride_created ──charge──▶ charge_created ──▶ finished (201 + the ride)
       │                       └─ declined card ───────────▶ finished (402, stored)
       └─ invalid request: 422, nothing stored (the same key may be retried corrected)

* ``started`` validates the request (a [`Reject`][idempotence.testing.example.Reject] here stores
  nothing, R5), then writes the ride and its audit record in the phase's transaction.
* ``ride_created`` charges the rider's card at the provider over HTTP, with no
  transaction open (R3) and the derived key ``rocket_rides-<key id>-charge`` (R4): a
  resumed run sends the same key and the provider returns the first charge.
* its recording phase puts the charge on the ride, or finishes with a stored 402.
* ``charge_created`` stages ``send_receipt`` (it commits with the phase, R7) and
  finishes with 201 and the ride.

The API (the HTTP middleware) and the completer both run this flow with the async
charger on an async store: the worker's async completer resumes abandoned keys
through the very flow the API runs (F7), with no blocking twin to keep in step.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from http import HTTPStatus
from typing import Any

import httpx

from idempotence.flows import Advance, Finish, Flow, ForeignContext, PhaseContext, Reject
from idempotence.http import Profile
from idempotence.states import DEFAULT_RETENTION, StoredResponse
from idempotence.testing.example import Statements, sql_phase
from idempotence.testing.provider import Charge

from . import chaos

__all__ = [
    "AMOUNT",
    "CURRENCY",
    "FIELDS",
    "FLOW_NAME",
    "FieldError",
    "ProviderFailed",
    "async_charger",
    "error_response",
    "ride_dict",
    "ride_json",
    "ride_params",
    "rides_flow",
    "validate",
]

FLOW_NAME = "rocket_rides"
AMOUNT = 2000
"""Every ride costs $20."""
CURRENCY = "usd"
FIELDS = {"origin_lat": 90.0, "origin_lon": 180.0, "target_lat": 90.0, "target_lon": 180.0}
"""The request's fields and the magnitude each may reach."""
_DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_JSON = {"content-type": "application/json"}

# -- the request --------------------------------------------------------------------------


def _coordinate(value: Any) -> Any:
    """A field's value as the flow stores it: a finite float, None when absent, or
    ``{"invalid": why}``. The parameters are stored as JSON on the key (and PostgreSQL's
    jsonb refuses NaN, infinities and NUL), so nothing else of the body is kept."""
    if value is None:
        return None
    if isinstance(value, bool):
        return {"invalid": "a boolean"}
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            return {"invalid": "a number that large"}
        return number if math.isfinite(number) else {"invalid": "a number that large"}
    if isinstance(value, str):
        # Form bodies carry everything as text, so a decimal string is a number too.
        text = value.strip()
        if _DECIMAL.fullmatch(text):
            number = float(text)
            return number if math.isfinite(number) else {"invalid": "a number that large"}
        return {"invalid": "text"}
    return {"invalid": "an object" if isinstance(value, dict) else "a list"}


def _printable(name: str) -> str:
    # Unknown field names are echoed back and stored; keep them to printable ASCII.
    return "".join(c if " " <= c <= "~" else "?" for c in name[:40])


def ride_params(user_id: str, card: str, body: Any) -> dict[str, Any]:
    """The flow's parameters from the parsed request body (JSON or form)."""
    params: dict[str, Any] = {"user": user_id, "card": card}
    if not isinstance(body, dict):
        params["body"] = "not an object"
        return params
    for field in FIELDS:
        params[field] = _coordinate(body.get(field))
    unknown = sorted(_printable(str(name)) for name in body if name not in FIELDS)
    if unknown:
        params["unknown"] = unknown[:10]
    return params


@dataclass(frozen=True, slots=True)
class FieldError:
    """What is wrong with one field of the request."""

    field: str
    code: str
    message: str


def validate(params: Any) -> list[FieldError]:
    """Every problem with the request, in field order; empty when it is valid.

    ```python
    validate({"origin_lat": 91.0, "origin_lon": 0.0, "target_lat": 0.0})[0].message
    # 'origin_lat must be between -90 and 90'
    ```
    """
    if not isinstance(params, dict) or params.get("body"):
        return [FieldError("body", "parameter_invalid", "the body must be a JSON object or a form")]
    errors = []
    for field, limit in FIELDS.items():
        value = params.get(field)
        if value is None:
            errors.append(FieldError(field, "parameter_missing", f"{field} is required"))
        elif isinstance(value, dict):
            why = value.get("invalid", "that")
            message = f"{field} must be a number, not {why}"
            errors.append(FieldError(field, "parameter_invalid", message))
        elif not -limit <= value <= limit:
            message = f"{field} must be between {-limit:g} and {limit:g}"
            errors.append(FieldError(field, "parameter_invalid", message))
    for name in params.get("unknown", ()):
        errors.append(FieldError(name, "parameter_unknown", f"{name} is not a parameter"))
    return errors


# -- responses ----------------------------------------------------------------------------


def error_response(
    profile: Profile, status: int, code: str, message: str, **extra: Any
) -> StoredResponse:
    """An error in the wire profile's shape: RFC 9457 problem details, or Stripe's
    ``{"error": {...}}``, with a stable ``code`` either way."""
    if profile is Profile.STRIPE:
        kind = "card_error" if status == 402 else "invalid_request_error"
        body: dict[str, Any] = {"error": {"type": kind, "code": code, "message": message, **extra}}
        return StoredResponse.of(status, _JSON, json.dumps(body, sort_keys=True))
    problem = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": message,
        "code": code,
        **extra,
    }
    headers = {"content-type": "application/problem+json"}
    return StoredResponse.of(status, headers, json.dumps(problem, sort_keys=True))


def _invalid(profile: Profile, errors: list[FieldError]) -> StoredResponse:
    message = "; ".join(error.message for error in errors)
    if profile is Profile.STRIPE:
        first = errors[0]
        return error_response(profile, 422, first.code, message, param=first.field)
    listed = [{"field": e.field, "code": e.code, "detail": e.message} for e in errors]
    return error_response(profile, 422, "parameter_invalid", message, errors=listed)


def ride_dict(row: dict[str, Any]) -> dict[str, Any]:
    """The ride as the API shows it, from its row."""
    return {
        "object": "ride",
        "id": row["id"],
        "amount": row["amount"],
        "currency": row["currency"],
        "status": row["status"],
        "charge_id": row["charge_id"],
        **{field: row[field] for field in FIELDS},
    }


def ride_json(row: dict[str, Any]) -> str:
    """The ride's JSON (a stable key order: it is stored and replayed)."""
    return json.dumps(ride_dict(row), sort_keys=True, separators=(",", ":"))


RIDE_COLUMNS = (
    "id, amount, currency, status, charge_id, origin_lat, origin_lon, target_lat, target_lon"
)

# -- the charge ---------------------------------------------------------------------------


class ProviderFailed(Exception):
    """The provider answered with an error: nothing to record; the run fails and a
    retry resumes with the same derived key."""


Charger = Callable[[ForeignContext], "Charge | Awaitable[Charge]"]
"""Charges through the provider for one run of the flow: ``(ctx) -> Charge``, or
``(ctx) -> Awaitable[Charge]`` as `async_charger` does."""


def _form(ctx: ForeignContext) -> dict[str, Any]:
    params = ctx.params
    return {
        "amount": str(AMOUNT),
        "currency": CURRENCY,
        "source": params["card"],
        # The reference ties the charge to the request, for the reconciliation (B5).
        "metadata[reference]": f"{ctx.record.scope}/{ctx.record.key}",
    }


def _charge_of(response: httpx.Response) -> Charge:
    if response.status_code in (200, 402):
        data = response.json()
        found = data if response.status_code == 200 else data["error"]["charge"]
        return Charge(**found)
    raise ProviderFailed(f"the provider answered {response.status_code}: {response.text[:200]}")


def async_charger(client: httpx.AsyncClient) -> Charger:
    """Charge over ``client`` (its base URL is the provider's)."""

    async def charge(ctx: ForeignContext) -> Charge:
        await chaos.pause(ctx.heartbeat)
        headers = {"Idempotency-Key": ctx.key_for("charge")}
        return _charge_of(await client.post("/v1/charges", data=_form(ctx), headers=headers))

    return charge


# -- the flow -------------------------------------------------------------------------------


def _of(ctx: PhaseContext) -> dict[str, Any]:
    return {"user_id": ctx.lease.scope, "key_id": ctx.lease.id}


@dataclass(frozen=True)
class _Steps:
    """The ride flow's steps, for one charger and one error profile; `rides_flow`
    wires them (the atomic ones through `sql_phase`)."""

    charger: Charger
    profile: Profile

    def create_ride(self, ctx: PhaseContext) -> Statements:
        errors = validate(ctx.params)
        if errors:
            # Nothing is committed yet: the key is forgotten, so the client can send
            # the corrected request with the same key (R5).
            raise Reject(_invalid(self.profile, errors))
        ride = {field: ctx.params[field] for field in FIELDS}
        rows = yield (
            "INSERT INTO rocket_rides (user_id, key_id, request_key, origin_lat, origin_lon,"
            " target_lat, target_lon, amount, currency, status) VALUES (:user_id, :key_id,"
            " :request_key, :origin_lat, :origin_lon, :target_lat, :target_lon, :amount,"
            " :currency, 'created') RETURNING id",
            {
                **_of(ctx),
                **ride,
                "request_key": ctx.lease.key,
                "amount": AMOUNT,
                "currency": CURRENCY,
            },
        )
        yield (
            "INSERT INTO rocket_audit_records (user_id, key_id, ride_id, action)"
            " VALUES (:user_id, :key_id, :ride_id, 'ride.created')",
            {**_of(ctx), "ride_id": rows[0]["id"]},
        )
        chaos.reached("ride:before_commit")
        return Advance("ride_created")

    def charge(self, ctx: ForeignContext) -> Charge | Awaitable[Charge]:
        chaos.reached("charge:before")
        charged = self.charger(ctx)
        if inspect.isawaitable(charged):
            return _after(charged)
        chaos.reached("charge:after")
        return charged

    def record_charge(self, ctx: PhaseContext, charge: Charge) -> Statements:
        status = "declined" if charge.declined else "charged"
        rows = yield (
            "UPDATE rocket_rides SET charge_id = :charge_id, status = :status"
            " WHERE user_id = :user_id AND key_id = :key_id RETURNING id",
            {**_of(ctx), "charge_id": charge.id, "status": status},
        )
        ride_id = rows[0]["id"]
        yield (
            "INSERT INTO rocket_audit_records (user_id, key_id, ride_id, action)"
            " VALUES (:user_id, :key_id, :ride_id, :action)",
            {**_of(ctx), "ride_id": ride_id, "action": f"charge.{status}"},
        )
        chaos.reached("record:before_commit")
        if charge.declined:
            # A terminal answer, stored and replayed like a success (R5).
            message = f"The card was declined (charge {charge.id}); no ride was booked."
            return Finish(
                error_response(
                    self.profile,
                    402,
                    "card_declined",
                    message,
                    charge_id=charge.id,
                    ride_id=ride_id,
                )
            )
        return Advance("charge_created")

    def finish_ride(self, ctx: PhaseContext) -> Statements:
        rows = yield (
            f"SELECT {RIDE_COLUMNS} FROM rocket_rides"
            " WHERE user_id = :user_id AND key_id = :key_id",
            _of(ctx),
        )
        ride = rows[0]
        ctx.stage(
            "send_receipt",
            {"ride_id": ride["id"], "user": ctx.lease.scope, "charge_id": ride["charge_id"]},
        )
        chaos.reached("finish:before_commit")
        return Finish(StoredResponse.of(201, _JSON, ride_json(ride)))


def rides_flow(
    charger: Charger,
    *,
    profile: Profile = Profile.IETF,
    lock_timeout: timedelta = timedelta(seconds=10),
    retention: timedelta = DEFAULT_RETENTION,
) -> Flow:
    """The ride flow, charging with ``charger``; errors in ``profile``'s shape.

    ``lock_timeout`` is how long a worker that died keeps the key from its retries;
    ``retention`` how long a finished key replays before the reaper deletes it (B3).
    """
    steps = _Steps(charger, profile)
    flow = Flow(FLOW_NAME, lock_timeout=lock_timeout, retention=retention)
    flow.phase("started")(sql_phase(steps.create_ride))
    flow.foreign(
        "ride_created", name="charge", call=steps.charge, record=sql_phase(steps.record_charge)
    )
    flow.phase("charge_created")(sql_phase(steps.finish_ride))
    return flow


async def _after(charged: Awaitable[Charge]) -> Charge:
    charge = await charged
    chaos.reached("charge:after")
    return charge
