"""The fake payment provider as an HTTP service: FakePay, a little Stripe.

It wraps [`FakeProvider`][idempotence.testing.provider.FakeProvider] (charges in a
SQLite file of its own, one charge per ``Idempotency-Key``, declines for cards ending in
``declined``) and adds what a network adds, each at a configurable rate:

* latency: every call waits between half of ``latency`` and all of it (seconds);
* ``fail_before_commit``: the connection drops before the charge commits (nothing is
  charged, and the caller cannot tell);
* ``drop_after_commit``: the charge commits, then the connection drops (the caller
  cannot tell it was charged: only a retry with the same key finds out);
* ``server_error``: a 500, nothing charged.

::

    POST /v1/charges   amount, currency, source, metadata[reference]  (form or JSON)
                       Idempotency-Key: one charge per key
                       200 the charge | 402 declined (the charge in error.charge)
                       400 a key reused with other parameters | 500 injected
    GET  /v1/charges   every charge, for reconciliation (?reference= to filter)
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from idempotence.testing.provider import (
    Charge,
    FakeProvider,
    Fault,
    IdempotencyKeyReused,
    ProviderError,
)

__all__ = ["Faults", "provider_app"]


@dataclass(frozen=True, slots=True)
class Faults:
    """How badly the provider behaves: rates are probabilities per charge request."""

    latency: float = 0.0
    """Each call waits a random time between half of this and all of it, in seconds."""
    fail_before_commit: float = 0.0
    drop_after_commit: float = 0.0
    server_error: float = 0.0

    def pick(self, rng: random.Random) -> Fault | None:
        """The fault for one request, or None."""
        roll = rng.random()
        for fault, rate in (
            (Fault.RESET_BEFORE_COMMIT, self.fail_before_commit),
            (Fault.RESET_AFTER_COMMIT, self.drop_after_commit),
            (Fault.SERVER_ERROR, self.server_error),
        ):
            if roll < rate:
                return fault
            roll -= rate
        return None


class _DroppedConnection(Response):
    """Promise a body and send none: the server then closes the connection, and the
    caller sees it drop mid-response (its HTTP client raises), as after a network cut."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"64")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})


class _QuietDrops(logging.Filter):
    # The server logs every response left incomplete; here that is the point.
    def filter(self, record: logging.LogRecord) -> bool:
        return "without completing response" not in record.getMessage()


def _error(status: int, kind: str, code: str, message: str, **extra: Any) -> JSONResponse:
    body = {"error": {"type": kind, "code": code, "message": message, **extra}}
    return JSONResponse(body, status_code=status)


async def _fields(request: Request) -> dict[str, Any]:
    body = await request.body()
    if request.headers.get("content-type", "").startswith("application/json"):
        data = json.loads(body or b"{}")
        return data if isinstance(data, dict) else {}
    # Parsed by hand: Starlette's form parser needs python-multipart, for nothing more
    # than this.
    return dict(urllib.parse.parse_qsl(body.decode("utf-8", "replace")))


def provider_app(path: str, faults: Faults | None = None, *, seed: int | None = None) -> Starlette:
    """The provider's ASGI app, keeping its charges in the SQLite file at ``path``."""
    faults = faults or Faults()
    rng = random.Random(seed)
    FakeProvider(path)  # create the schema once, before any request
    local = threading.local()
    logging.getLogger("uvicorn.error").addFilter(_QuietDrops())

    def provider() -> FakeProvider:
        # One FakeProvider per thread: its injected faults are queued per object, so a
        # fault queued for this request can only be taken by this request.
        if not hasattr(local, "provider"):
            local.provider = FakeProvider(path)
        found: FakeProvider = local.provider
        return found

    def charge(
        amount: int, card: str, key: str | None, reference: str | None, fault: Fault | None
    ) -> Charge:
        fake = provider()
        if fault is not None:
            fake.fail_next(fault)
        return fake.charge(amount, card, key, reference=reference)

    async def create_charge(request: Request) -> Response:
        try:
            fields = await _fields(request)
            amount = int(fields["amount"])
            card = str(fields["source"])
        except (KeyError, ValueError, TypeError):
            return _error(
                400, "invalid_request_error", "parameter_missing", "amount and source are required"
            )
        reference = fields.get("metadata[reference]") or fields.get("reference")
        key = request.headers.get("idempotency-key")
        if faults.latency:
            await asyncio.sleep(rng.uniform(faults.latency / 2, faults.latency))
        fault = faults.pick(rng)
        try:
            made = await run_in_threadpool(charge, amount, card, key, reference, fault)
        except (ConnectionError, TimeoutError):
            return _DroppedConnection()
        except IdempotencyKeyReused as exc:
            return _error(400, "idempotency_error", "idempotency_key_reused", exc.message)
        except ProviderError as exc:
            return _error(exc.status, "api_error", "internal_error", exc.message)
        if made.declined:
            return _error(
                402, "card_error", "card_declined", "Your card was declined.", charge=made.to_json()
            )
        return JSONResponse(made.to_json())

    async def list_charges(request: Request) -> Response:
        reference = request.query_params.get("reference")
        charges = await run_in_threadpool(lambda: provider().charges(reference=reference))
        return JSONResponse({"object": "list", "data": [c.to_json() for c in charges]})

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/v1/charges", create_charge, methods=["POST"]),
            Route("/v1/charges", list_charges, methods=["GET"]),
            Route("/healthz", health),
        ]
    )
