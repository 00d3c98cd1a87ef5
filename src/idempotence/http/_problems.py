"""Error responses in two wire profiles: IETF problem details and Stripe's error body.

Every refusal the middleware makes is a :class:`Problem` (what went wrong, with a
stable machine-readable ``code``) rendered by a :class:`Profile`:

* ``ietf`` (the default) follows the IETF Idempotency-Key draft: RFC 9457
  ``application/problem+json`` bodies, 422 for a key reused with another request,
  409 for a key still in progress.
* ``stripe`` answers the way Stripe's API does, so existing Stripe-style clients keep
  working: ``{"error": {"type": ..., "code": ..., "message": ...}}`` as
  ``application/json``, and 400 (not 422) for a reused key.

>>> response = render(Profile.IETF, Problem.KEY_REUSED, "Use a new key.")
>>> response.status, dict(response.headers)["content-type"]
(422, 'application/problem+json')
>>> render(Profile.STRIPE, Problem.KEY_REUSED, "Use a new key.").status
400
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from http import HTTPStatus

from ..states import StoredResponse

__all__ = ["Problem", "Profile", "render"]


class Profile(enum.Enum):
    """How errors look on the wire."""

    #: RFC 9457 problem details; mismatch 422, in progress 409 (the IETF draft).
    IETF = "ietf"
    #: Stripe's ``{"error": {...}}`` body; mismatch 400, in progress 409.
    STRIPE = "stripe"


class Problem(enum.Enum):
    """Every refusal the middleware makes: (code, IETF status, Stripe error type).

    The code is stable: clients may switch on it (``code`` in a problem body,
    ``error.code`` in a Stripe body).
    """

    #: P7: the endpoint requires a key and none was sent.
    KEY_MISSING = ("idempotency_key_missing", 400, "invalid_request_error")
    #: P7, P8: the key is empty, too long, not printable ASCII, or badly quoted.
    KEY_INVALID = ("idempotency_key_invalid", 400, "idempotency_error")
    #: Two Idempotency-Key fields (or a bare key with a comma: see keys in the README).
    KEY_REPEATED = ("idempotency_key_repeated", 400, "idempotency_error")
    #: P2: the key was first used for a different request.
    KEY_REUSED = ("idempotency_key_reused", 422, "idempotency_error")
    #: P4: another request with this key is still running.
    KEY_IN_USE = ("idempotency_key_in_use", 409, "idempotency_error")
    #: Another worker took the key over while this one ran (F1): retry to get its answer.
    KEY_TAKEN_OVER = ("idempotency_key_taken_over", 409, "idempotency_error")
    #: The scope callable found no tenant for the request.
    TENANT_UNKNOWN = ("idempotency_tenant_unknown", 401, "invalid_request_error")
    #: P7: the request body is larger than the endpoint accepts.
    BODY_TOO_LARGE = ("request_body_too_large", 413, "invalid_request_error")
    #: The body cannot be read as its content type (malformed JSON, bad UTF-8).
    BODY_INVALID = ("request_body_invalid", 400, "invalid_request_error")
    #: A flow endpoint reads JSON or form bodies only.
    BODY_UNSUPPORTED = ("request_body_unsupported", 415, "invalid_request_error")
    #: P11: the key store cannot be reached; nothing ran.
    STORE_UNAVAILABLE = ("idempotency_store_unavailable", 503, "api_error")
    #: The key store failed in another way; nothing ran.
    STORE_FAILED = ("idempotency_store_failed", 500, "api_error")
    #: The app raised; stored only when the endpoint stores server errors (R5).
    SERVER_ERROR = ("internal_error", 500, "api_error")
    #: Request-as-transaction: the response was too large to store, so nothing was kept.
    RESPONSE_TOO_LARGE = ("response_too_large", 500, "api_error")
    #: Stored for a request that ran but whose response was too large to store.
    RESPONSE_NOT_REPLAYABLE = ("response_not_replayable", 500, "api_error")

    def __init__(self, code: str, status: int, stripe_type: str) -> None:
        self.code = code
        self.status = status
        self.stripe_type = stripe_type


def status_for(profile: Profile, problem: Problem) -> int:
    """The status ``profile`` answers ``problem`` with."""
    if profile is Profile.STRIPE and problem is Problem.KEY_REUSED:
        return 400  # Stripe answers a reused key with 400 invalid_request / idempotency_error
    return problem.status


def render(
    profile: Profile,
    problem: Problem,
    detail: str,
    headers: Sequence[tuple[str, str]] = (),
) -> StoredResponse:
    """The response for ``problem`` in ``profile``, with ``detail`` saying what to fix.

    >>> body = render(Profile.STRIPE, Problem.KEY_IN_USE, "Retry in 1 second.").body
    >>> json.loads(body)["error"]["code"]
    'idempotency_key_in_use'
    """
    status = status_for(profile, problem)
    if profile is Profile.STRIPE:
        payload: dict[str, object] = {
            "error": {"type": problem.stripe_type, "code": problem.code, "message": detail}
        }
        content_type = "application/json"
    else:
        # RFC 9457: with the default type "about:blank" the title is the status
        # phrase; the stable code is an extension member, so clients need not
        # parse the human-readable detail.
        payload = {
            "type": "about:blank",
            "title": HTTPStatus(status).phrase,
            "status": status,
            "detail": detail,
            "code": problem.code,
        }
        content_type = "application/problem+json"
    body = json.dumps(payload, ensure_ascii=True).encode("ascii")
    return StoredResponse(status, (("content-type", content_type), *headers), body)
