"""Problems in two wire profiles: IETF problem details and Stripe's error body.

Every problem the library makes is a profile-neutral `ProblemDetails` (what went wrong,
with a stable machine-readable ``code``); a [`Profile`][idempotence.http.Profile]
renders it when it goes on the wire, fresh or replayed (F6):

* ``ietf`` (the default) follows the IETF Idempotency-Key draft: RFC 9457
  ``application/problem+json`` bodies, 422 for a key reused with another request,
  409 for a key still in progress.
* ``stripe`` answers the way Stripe's API does, so existing Stripe-style clients keep
  working: ``{"error": {"type": ..., "code": ..., "message": ...}}`` as
  ``application/json``, and 400 (not 422) for a reused key.

```python
response = render(Profile.IETF, Problem.KEY_REUSED, "Use a new key.")
response.status, dict(response.headers)["content-type"]
# (422, 'application/problem+json')
render(Profile.STRIPE, Problem.KEY_REUSED, "Use a new key.").status
# 400
```
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence

from ..problems import Problem, ProblemDetails
from ..states import StoredResponse

__all__ = ["Problem", "Profile", "render", "render_details", "render_stored"]


class Profile(enum.Enum):
    """How errors look on the wire."""

    IETF = "ietf"
    """RFC 9457 problem details; mismatch 422, in progress 409 (the IETF draft)."""
    STRIPE = "stripe"
    """Stripe's ``{"error": {...}}`` body; mismatch 400, in progress 409."""


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

    ```python
    body = render(Profile.STRIPE, Problem.KEY_IN_USE, "Retry in 1 second.").body
    json.loads(body)["error"]["code"]
    # 'idempotency_key_in_use'
    ```
    """
    return render_details(profile, ProblemDetails.of(problem, detail, headers))


def render_details(profile: Profile, details: ProblemDetails) -> StoredResponse:
    """``details`` on the wire in ``profile``."""
    problem = details.problem
    status = details.status if problem is None else status_for(profile, problem)
    if profile is Profile.STRIPE:
        # A code this release does not know (stored by a newer one) is still a failure
        # of ours, so it is reported as Stripe reports its own: api_error.
        kind = "api_error" if problem is None else problem.stripe_type
        error = {"type": kind, "code": details.code, "message": details.detail}
        payload: dict[str, object] = {"error": error}
        content_type = "application/json"
    else:
        # RFC 9457: with the default type "about:blank" the title is the status
        # phrase; the stable code is an extension member, so clients need not
        # parse the human-readable detail.
        payload = {
            "type": "about:blank",
            "title": details.title,
            "status": status,
            "detail": details.detail,
            "code": details.code,
        }
        content_type = "application/problem+json"
    body = json.dumps(payload, ensure_ascii=True).encode("ascii")
    return StoredResponse(status, (("content-type", content_type), *details.headers), body)


def render_stored(profile: Profile, response: StoredResponse) -> StoredResponse:
    """A stored or flow response ready for ``profile``: a library problem kept in
    neutral form is rendered; anything else (the application's own response, or a
    problem an earlier release stored rendered) is the stored response, verbatim (P3).
    """
    details = ProblemDetails.from_stored(response)
    return response if details is None else render_details(profile, details)
