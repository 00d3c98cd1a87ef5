"""The problems the library itself answers with, profile-neutral (F6).

Every refusal or failure the library makes (a missing key, a store outage, a flow
that failed, a foreign call of unknown outcome, a key the completer gave up on) is a
`ProblemDetails`: a status, a stable [`Problem`][idempotence.problems.Problem] code, a title and a
detail that says what to do. How it looks on the wire (RFC 9457 problem details or
Stripe's error body) is the HTTP layer's choice, made when it answers
([`idempotence.http`][idempotence.http]), so the same stored problem replays in the profile of the
endpoint that replays it.

A problem that is stored with a key is stored in a neutral form of its own: the
content type `NEUTRAL_TYPE` and a small JSON body. An application's own
responses (its ``application/problem+json`` included) never carry that type, so they
are always replayed verbatim.

```python
details = ProblemDetails.of(Problem.OUTCOME_UNKNOWN, "Ask an operator.")
stored = details.stored()
stored.status, dict(stored.headers)["content-type"]
# (502, 'application/vnd.idempotence.problem+json')
ProblemDetails.from_stored(stored) == details
# True
```
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus

from .states import StoredResponse

__all__ = ["NEUTRAL_TYPE", "Problem", "ProblemDetails"]

NEUTRAL_TYPE = "application/vnd.idempotence.problem+json"
"""The content type of a stored library problem; never sent on the wire as it is."""


class Problem(enum.Enum):
    """Every problem the library answers with: (code, status, Stripe error type).

    The code is stable: clients may switch on it (``code`` in a problem body,
    ``error.code`` in a Stripe body).
    """

    KEY_MISSING = ("idempotency_key_missing", 400, "invalid_request_error")
    """P7: the endpoint requires a key and none was sent."""
    KEY_INVALID = ("idempotency_key_invalid", 400, "idempotency_error")
    """P7, P8: the key is empty, too long, not printable ASCII, or badly quoted."""
    KEY_REPEATED = ("idempotency_key_repeated", 400, "idempotency_error")
    """Two Idempotency-Key fields (or a bare key with a comma, which reads as two)."""
    KEY_REUSED = ("idempotency_key_reused", 422, "idempotency_error")
    """P2: the key was first used for a different request."""
    KEY_IN_USE = ("idempotency_key_in_use", 409, "idempotency_error")
    """P4: another request with this key is still running."""
    KEY_TAKEN_OVER = ("idempotency_key_taken_over", 409, "idempotency_error")
    """Another worker took the key over while this one ran (F1): retry to get its answer."""
    OPERATION_UNKNOWN = ("idempotency_operation_unknown", 404, "invalid_request_error")
    """The status URL of an asynchronous operation names no operation of this tenant."""
    KEY_UNKNOWN = ("idempotency_key_unknown", 404, "invalid_request_error")
    """A key's status URL names a key this tenant never sent, or one already deleted."""
    KEY_EXPIRED = ("idempotency_key_expired", 410, "idempotency_error")
    """A key's status URL names a key past its retention, not yet deleted."""
    STATUS_QUERY_INVALID = ("idempotency_status_query_invalid", 400, "invalid_request_error")
    """A key's status URL names its endpoint wrongly (``?method=...&path=...``)."""
    TENANT_UNKNOWN = ("idempotency_tenant_unknown", 401, "invalid_request_error")
    """The scope callable found no tenant for the request."""
    BODY_TOO_LARGE = ("request_body_too_large", 413, "invalid_request_error")
    """P7: the request body is larger than the endpoint accepts."""
    BODY_INVALID = ("request_body_invalid", 400, "invalid_request_error")
    """The body cannot be read as its content type (malformed JSON, bad UTF-8)."""
    BODY_UNSUPPORTED = ("request_body_unsupported", 415, "invalid_request_error")
    """A flow endpoint reads JSON or form bodies only."""
    STORE_UNAVAILABLE = ("idempotency_store_unavailable", 503, "api_error")
    """P11: the key store cannot be reached; nothing ran."""
    STORE_FAILED = ("idempotency_store_failed", 500, "api_error")
    """The key store failed in another way; nothing ran."""
    SERVER_ERROR = ("internal_error", 500, "api_error")
    """The app or a flow raised; stored only when the endpoint stores server errors (R5)."""
    RESPONSE_TOO_LARGE = ("response_too_large", 500, "api_error")
    """Request-as-transaction: the response was too large to store, so nothing was kept."""
    RESPONSE_NOT_REPLAYABLE = ("response_not_replayable", 500, "api_error")
    """Stored for a request that ran but whose response was too large to store."""
    OUTCOME_UNKNOWN = ("outcome_unknown", 502, "api_error")
    """R6: a non-idempotent foreign call failed indeterminately; stored, for a human."""
    REQUEST_ABANDONED = ("request_abandoned", 500, "api_error")
    """B2: the completer ran out of attempts; stored, for a human."""
    REQUEST_EXPIRED = ("request_expired", 408, "idempotency_error")
    """B3: the key expired before its request finished; stored by the reaper."""

    def __init__(self, code: str, status: int, stripe_type: str) -> None:
        self.code = code
        self.status = status
        self.stripe_type = stripe_type

    @classmethod
    def by_code(cls, code: str) -> Problem | None:
        """The problem with ``code``, or None (a code from a newer release)."""
        return _BY_CODE.get(code)


_BY_CODE = {problem.code: problem for problem in Problem}


@dataclass(frozen=True, slots=True)
class ProblemDetails:
    """One problem, as the library made it, in no wire profile yet.

    ``headers`` go out with it whatever the profile (``retry-after``).
    """

    status: int
    code: str
    title: str
    detail: str
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(
        cls, problem: Problem, detail: str, headers: Sequence[tuple[str, str]] = ()
    ) -> ProblemDetails:
        """``problem`` with ``detail``; the title is the status phrase (RFC 9457's
        rule for problems of type ``about:blank``)."""
        title = HTTPStatus(problem.status).phrase
        return cls(problem.status, problem.code, title, detail, tuple(headers))

    @property
    def problem(self) -> Problem | None:
        return Problem.by_code(self.code)

    def stored(self) -> StoredResponse:
        """The neutral form kept in the key table (see the module docstring)."""
        payload = {
            "code": self.code,
            "status": self.status,
            "title": self.title,
            "detail": self.detail,
        }
        body = json.dumps(payload, ensure_ascii=True).encode("ascii")
        return StoredResponse(self.status, (("content-type", NEUTRAL_TYPE), *self.headers), body)

    @classmethod
    def from_stored(cls, response: StoredResponse) -> ProblemDetails | None:
        """The problem ``response`` holds in neutral form, or None: an application's
        response, or a problem stored rendered by an earlier release."""
        if not is_neutral(response):
            return None
        try:
            payload = json.loads(response.body)
            code, title, detail = payload["code"], payload["title"], payload["detail"]
        except (ValueError, TypeError, KeyError):
            return None  # not ours after all: replayed as it is
        if not all(isinstance(value, str) for value in (code, title, detail)):
            return None
        headers = tuple(
            (name, value) for name, value in response.headers if name.lower() != "content-type"
        )
        return cls(response.status, code, title, detail, headers)


def is_neutral(response: StoredResponse) -> bool:
    """Whether ``response`` is a library problem in neutral form."""
    # A loop, not any() of a generator: every replay asks.
    for name, value in response.headers:
        if name.lower() == "content-type" and value.lower() == NEUTRAL_TYPE:
            return True
    return False
