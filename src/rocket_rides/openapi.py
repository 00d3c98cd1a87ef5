"""The Rocket Rides API described in OpenAPI 3.1, and a small page about it at /docs.

Written by hand: the ride endpoint is served by the idempotency middleware, not by a
route a framework could introspect, and its interesting answers (replays, 409, 422 on
a reused key) are the library's.
"""

from __future__ import annotations

from typing import Any

from idempotence.http import Profile

from .rides import AMOUNT, FIELDS

__all__ = ["DOCS_HTML", "document"]


def _coordinate(field: str, limit: float) -> dict[str, Any]:
    where = "latitude" if field.endswith("lat") else "longitude"
    end = "pick-up" if field.startswith("origin") else "drop-off"
    return {
        "type": "number",
        "minimum": -limit,
        "maximum": limit,
        "description": f"The {end} {where} in degrees. Form bodies send it as a decimal string.",
    }


def _error_schema(profile: Profile) -> dict[str, Any]:
    if profile is Profile.STRIPE:
        return {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["type", "code", "message"],
                    "properties": {
                        "type": {"type": "string"},
                        "code": {"type": "string"},
                        "message": {"type": "string"},
                        "param": {"type": "string"},
                    },
                }
            },
        }
    return {
        "type": "object",
        "description": "RFC 9457 problem details, with a stable machine-readable code.",
        "required": ["type", "title", "status", "detail", "code"],
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string", "description": "What went wrong and what to do."},
            "code": {"type": "string"},
            "errors": {
                "type": "array",
                "description": "For 422 validation errors: one entry per field.",
                "items": {
                    "type": "object",
                    "properties": {
                        "field": {"type": "string"},
                        "code": {"type": "string"},
                        "detail": {"type": "string"},
                    },
                },
            },
        },
    }


def _error(description: str, *, retry_after: bool = False) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Error"}},
            "application/json": {"schema": {"$ref": "#/components/schemas/Error"}},
        },
    }
    if retry_after:
        response["headers"] = {
            "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}
        }
    return response


# The document is built afresh on each call, from one builder per part: a caller may
# change what it gets without changing the next one.

_AUTH = "apiKey"


def _ride_request_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": list(FIELDS),
        "additionalProperties": False,
        "properties": {field: _coordinate(field, limit) for field, limit in FIELDS.items()},
    }


def _ride_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "object": {"const": "ride"},
            "id": {"type": "integer"},
            "amount": {"type": "integer", "description": "In cents: every ride costs $20."},
            "currency": {"type": "string"},
            "status": {"enum": ["charged", "declined", "created"]},
            "charge_id": {"type": ["string", "null"]},
            **{field: {"type": "number"} for field in FIELDS},
        },
    }


def _create_ride_responses(profile: Profile) -> dict[str, Any]:
    # The middleware's answers: where a reused key is refused depends on the profile.
    stripe = profile is Profile.STRIPE
    reused = "the key was used for a different request (another body)"
    return {
        "201": {
            "description": "The ride, booked and paid. Retries with the same key get this "
            "same response with `Idempotent-Replayed: true`.",
            "headers": {"Idempotent-Replayed": {"schema": {"const": "true"}}},
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Ride"}}},
        },
        "400": _error(
            "No Idempotency-Key, a malformed one, or a body that does not parse"
            + (f"; or {reused}." if stripe else ".")
        ),
        "401": _error("No API key, or an unknown one."),
        "402": _error("The card was declined. Stored: retries get the same answer."),
        "409": _error(
            "A request with this key is still being processed: retry after Retry-After.",
            retry_after=True,
        ),
        "413": _error("The body is larger than 8 KiB."),
        "415": _error("The body is neither JSON nor form-encoded."),
        "422": _error(
            "Invalid fields: nothing is stored, so fix them and retry with the same key"
            + ("." if stripe else f"; or {reused} (code idempotency_key_reused).")
        ),
        "500": _error(
            "Something failed and nothing was stored. Retry with the same key: the work "
            "resumes where it stopped."
        ),
        "503": _error("The key store is unavailable; nothing ran.", retry_after=True),
    }


def _create_ride(profile: Profile) -> dict[str, Any]:
    request = {"schema": {"$ref": "#/components/schemas/RideRequest"}}
    return {
        "summary": "Book a ride and charge for it",
        "operationId": "createRide",
        "security": [{_AUTH: []}],
        "parameters": [
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": True,
                "description": "1-255 printable ASCII characters, bare or as a "
                'structured-field string ("…"). One key per ride.',
                "schema": {"type": "string", "minLength": 1, "maxLength": 255},
            }
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": request,
                "application/x-www-form-urlencoded": request,
            },
        },
        "responses": _create_ride_responses(profile),
    }


def _list_rides() -> dict[str, Any]:
    rides = {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": {"$ref": "#/components/schemas/Ride"}},
        },
    }
    return {
        "summary": "The caller's rides, newest first",
        "operationId": "listRides",
        "security": [{_AUTH: []}],
        "parameters": [
            {
                "name": "limit",
                "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
            }
        ],
        "responses": {
            "200": {
                "description": "The rides.",
                "content": {"application/json": {"schema": rides}},
            },
            "401": _error("No API key, or an unknown one."),
        },
    }


def document(profile: Profile = Profile.IETF) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API in ``profile``'s error shape."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Rocket Rides",
            "version": "1.0.0",
            "description": "Book a ride and pay for it exactly once, however often the "
            "request is retried. Seeded API keys: user-1 … user-100; user-N-declined "
            f"pays with a card that is declined. Every ride costs {AMOUNT} cents.",
        },
        "servers": [{"url": "/"}],
        "paths": {"/v1/rides": {"post": _create_ride(profile), "get": _list_rides()}},
        "components": {
            "securitySchemes": {
                _AUTH: {"type": "http", "scheme": "bearer", "description": "user-1 … user-100"}
            },
            "schemas": {
                "RideRequest": _ride_request_schema(),
                "Ride": _ride_schema(),
                "Error": _error_schema(profile),
            },
        },
    }


DOCS_HTML = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Rocket Rides API</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:48rem;margin:2rem auto;padding:0 1rem}
code,pre{background:#f4f4f4;padding:.1rem .3rem}pre{padding:.8rem;overflow:auto}</style></head>
<body>
<h1>Rocket Rides</h1>
<p>Book a ride and pay $20 for it, exactly once, however often you retry. The machine-readable
description is <a href="/openapi.json">/openapi.json</a> (OpenAPI 3.1).</p>
<h2>POST /v1/rides</h2>
<pre>curl -i http://HOST/v1/rides \\
  -H 'Authorization: Bearer user-1' \\
  -H 'Idempotency-Key: ride-0001' \\
  -H 'Content-Type: application/json' \\
  -d '{"origin_lat": 48.88, "origin_lon": 2.35, "target_lat": 48.72, "target_lon": 2.38}'</pre>
<ul>
<li><b>201</b>: the ride. Send the same request again with the same key: the same response,
with <code>Idempotent-Replayed: true</code>, and no second charge.</li>
<li><b>402</b>: the card was declined (API keys ending in <code>-declined</code>); stored too.</li>
<li><b>409</b> + <code>Retry-After</code>: the same key is being processed right now.</li>
<li><b>422</b>: an invalid field (nothing stored: fix it, keep the key), or the key was used
for another body.</li>
<li><b>400</b> no <code>Idempotency-Key</code>; <b>401</b> no or unknown API key;
<b>413</b> body over 8 KiB.</li>
</ul>
<p>Form bodies work too, as with Stripe: <code>-d origin_lat=48.88 -d origin_lon=2.35 …</code>.</p>
<h2>GET /v1/rides</h2>
<p>Your rides, newest first (<code>?limit=</code>, up to 1000).</p>
</body>
</html>
"""
