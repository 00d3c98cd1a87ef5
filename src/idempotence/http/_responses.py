"""What the middleware answers, without I/O: how a status settles the key (R5), which
headers are stored, what goes on the wire, and the problem replies of DESIGN 4.
"""

from __future__ import annotations

import enum
import logging
import math

from ..errors import StoreError, StoreUnavailable
from ..problems import ProblemDetails
from ..states import Claim, Outcome, StoredResponse
from ..stores import TransientError
from ._config import Policy
from ._effects import Captured, Reply, ReplyKind
from ._problems import Problem, Profile, render, render_stored

logger = logging.getLogger("idempotence.http")

#: Store failures that mean "not now": answered 503 with Retry-After (P11).
DOWN = (StoreUnavailable, TransientError)
_NO_BODY_STATUSES = frozenset({204, 304})

# -- pure rules -------------------------------------------------------------------------------


class Action(enum.Enum):
    STORE = "store"
    RELEASE = "release"
    FORGET = "forget"


def classify(policy: Policy, status: int) -> Action:
    """What becomes of the key after the app answered ``status`` (R5).

    >>> classify(Policy(), 201), classify(Policy(), 402), classify(Policy(), 422)
    (<Action.STORE: 'store'>, <Action.STORE: 'store'>, <Action.FORGET: 'forget'>)
    >>> classify(Policy(), 503), classify(Policy(store_server_errors=True), 503)
    (<Action.RELEASE: 'release'>, <Action.STORE: 'store'>)
    """
    if status >= 500:
        return Action.STORE if policy.store_server_errors else Action.RELEASE
    if status in policy.rejected_statuses:
        return Action.FORGET
    return Action.STORE


def storable(policy: Policy, captured: Captured) -> StoredResponse:
    """The response as stored for replay: status, allowed headers only, body."""
    allowed = policy.stored_headers
    headers = tuple((name.lower(), value) for name, value in captured.headers)
    kept = tuple((name, value) for name, value in headers if name in allowed)
    return StoredResponse(captured.status, kept, captured.body)


def finalize(response: StoredResponse, *, replayed: bool = False) -> StoredResponse:
    """``response`` ready for the wire: a Content-Length when it has none, and
    ``Idempotent-Replayed: true`` on a replay (P3)."""
    headers = list(response.headers)
    if replayed:
        headers.append(("idempotent-replayed", "true"))
    has_length = any(name.lower() == "content-length" for name, _ in headers)
    if not has_length and response.status not in _NO_BODY_STATUSES and response.status >= 200:
        headers.append(("content-length", str(len(response.body))))
    return StoredResponse(response.status, tuple(headers), response.body)


def problem_reply(
    profile: Profile, problem: Problem, detail: str, headers: tuple[tuple[str, str], ...] = ()
) -> Reply:
    return Reply(ReplyKind.RESPOND, finalize(render(profile, problem, detail, headers)))


def retry_after(seconds: int) -> tuple[tuple[str, str], ...]:
    return (("retry-after", str(max(1, seconds))),)


def answer(claim: Claim, policy: Policy, profile: Profile) -> Reply:
    """The reply to a claim this request did not win (P2, P3, P4)."""
    if claim.outcome is Outcome.REPLAY:
        assert claim.response is not None
        return Reply(
            ReplyKind.RESPOND, finalize(render_stored(profile, claim.response), replayed=True)
        )
    record = claim.record
    if claim.outcome is Outcome.MISMATCH:
        return problem_reply(
            profile,
            Problem.KEY_REUSED,
            f"This Idempotency-Key was already used for a different request (first for "
            f"{record.method} {record.path}, with another method, path or body). Send a "
            "new key for a new request, or resend the original request unchanged.",
        )
    # Retry-After: the holder will most likely finish long before its lock expires,
    # so the hint is the configured interval, capped by the lock's remaining time.
    remaining = math.ceil(claim.retry_after or 0.0)
    seconds = max(1, min(policy.in_progress_retry_after, remaining or 1))
    return problem_reply(
        profile,
        Problem.KEY_IN_USE,
        "A request with this Idempotency-Key is still being processed. Retry after "
        f"{seconds} second{'s' if seconds != 1 else ''} with the same key to get its response.",
        retry_after(seconds),
    )


def store_down(policy: Policy, profile: Profile, exc: StoreError, *, rolled_back: bool) -> Reply:
    what = "was rolled back" if rolled_back else "was not processed"
    if isinstance(exc, DOWN):
        logger.warning("idempotency key store unavailable: %s", exc)
        seconds = policy.unavailable_retry_after
        return problem_reply(
            profile,
            Problem.STORE_UNAVAILABLE,
            f"The idempotency key store is unavailable, so this request {what}. Retry "
            f"with the same Idempotency-Key after {seconds} seconds.",
            retry_after(seconds),
        )
    logger.error("idempotency key store failed: %s", exc, exc_info=exc)
    return problem_reply(
        profile,
        Problem.STORE_FAILED,
        f"The idempotency key store failed, so this request {what}. Retry later with "
        "the same Idempotency-Key.",
    )


#: Stored when the app raised on an endpoint that stores server errors (R5); neutral,
#: so every replay renders it in the endpoint's profile.
STORED_SERVER_ERROR = ProblemDetails.of(
    Problem.SERVER_ERROR,
    "The request failed with an unexpected error. Retrying it returns this answer.",
).stored()


def as_response(captured: Captured) -> StoredResponse:
    return StoredResponse(captured.status, captured.headers, captured.body)
