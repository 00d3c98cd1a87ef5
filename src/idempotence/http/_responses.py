"""What the middleware answers, without I/O: what goes on the wire, and the problem
replies of DESIGN 4. How a status settles the key (R5) and which headers are stored
is the engine's ([`HandlerStep`][idempotence.flows.steps.HandlerStep]).
"""

from __future__ import annotations

import logging
import math

from ..errors import AnswerNotStored, ConfigurationError, StoreError, StoreUnavailable
from ..states import Claim, Outcome, StoredResponse
from ..stores import TransientError
from ._config import Policy
from ._effects import Reply, ReplyKind
from ._problems import Problem, Profile, render, render_stored

logger = logging.getLogger("idempotence.http")

DOWN = (StoreUnavailable, TransientError)
"""Store failures that mean "not now": answered 503 with Retry-After (P11)."""
_NO_BODY_STATUSES = frozenset({204, 304})

# -- pure rules -------------------------------------------------------------------------------


def finalize(response: StoredResponse, *, replayed: bool = False) -> StoredResponse:
    """``response`` ready for the wire: a Content-Length when it has none, and
    ``Idempotent-Replayed: true`` on a replay (P3)."""
    status = response.status
    length = status >= 200 and status not in _NO_BODY_STATUSES
    if length:
        for name, _ in response.headers:
            if name.lower() == "content-length":
                length = False
                break
    if not (replayed or length):
        return response  # as it is (most apps' answers): no copy
    headers = list(response.headers)
    if replayed:
        headers.append(("idempotent-replayed", "true"))
    if length:
        headers.append(("content-length", str(len(response.body))))
    return StoredResponse(status, tuple(headers), response.body)


def problem_reply(
    profile: Profile, problem: Problem, detail: str, headers: tuple[tuple[str, str], ...] = ()
) -> Reply:
    return Reply(ReplyKind.RESPOND, finalize(render(profile, problem, detail, headers)))


def no_tenant(profile: Profile) -> Reply:
    return problem_reply(
        profile,
        Problem.TENANT_UNKNOWN,
        "This request carries no account to scope its Idempotency-Key to: "
        "authenticate, then retry with the same key.",
    )


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
        if isinstance(exc, ConfigurationError):
            # Every request meets it until someone fixes the URL: an error, not the
            # warning of an outage that passes.
            logger.error("idempotency key store misconfigured: %s", exc)
        else:
            logger.warning("idempotency key store unavailable: %s", exc)
        seconds = policy.unavailable_retry_after
        detail = (
            f"The idempotency key store is unavailable, so this request {what}. Retry "
            f"with the same Idempotency-Key after {seconds} seconds."
        )
        if isinstance(exc, AnswerNotStored):
            # Handler mode: the app ran, and its response is being stored in the
            # background; sent now, it could differ from what a retry gets.
            detail = (
                "This request was processed, but the idempotency key store is "
                "unavailable, so its response could not be stored and is not sent. Retry "
                f"with the same Idempotency-Key after {seconds} seconds to get it."
            )
        return problem_reply(profile, Problem.STORE_UNAVAILABLE, detail, retry_after(seconds))
    logger.error("idempotency key store failed: %s", exc, exc_info=exc)
    return problem_reply(
        profile,
        Problem.STORE_FAILED,
        f"The idempotency key store failed, so this request {what}. Retry later with "
        "the same Idempotency-Key.",
    )
