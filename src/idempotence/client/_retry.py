"""What the client decides after each attempt, without I/O (DESIGN 10).

[`classify`][idempotence.client.classify] reads one attempt's answer (a response, or the
transport error that took its place) and says whether it is final, worth another attempt
with the same key, or a client bug; [`Retry`][idempotence.client.Retry] holds the limits
and computes each pause: exponential backoff with full jitter, or the server's
``Retry-After`` when it sent one. The drivers (`_client_async` and the generated
`_client`) only send and sleep.
"""

from __future__ import annotations

import enum
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

import httpx

from ..errors import ConfigurationError, KeyReused, RetriesExhausted
from ..problems import Problem

__all__ = [
    "KEY_HEADER",
    "REPLAYED_HEADER",
    "Attempt",
    "IdempotentResponse",
    "Retry",
    "Verdict",
    "classify",
    "new_key",
    "parse_retry_after",
]

KEY_HEADER = "Idempotency-Key"
"""The request header that carries the key (P8)."""
REPLAYED_HEADER = "idempotent-replayed"
"""The header a guarded server adds to a replayed answer (P3)."""

_BUSY = frozenset({Problem.KEY_IN_USE.code, Problem.KEY_TAKEN_OVER.code})
"""409 problems that mean "this key is busy, come back": the in-progress answer (P4)
and the takeover of a request while it ran. Any other 409 is the application's."""


class Verdict(enum.Enum):
    """What one attempt's answer means for the operation."""

    FINAL = "final"
    """The operation's answer: return it (2xx, 3xx, a 4xx, a stored 5xx)."""
    RETRY = "retry"
    """Not an answer yet: try again with the same key, after a pause."""
    KEY_REUSED = "key_reused"
    """The key was already used for another request (P2): a bug in the caller."""


def problem_field(response: httpx.Response, ietf: str, stripe: str) -> str | None:
    """A field of a problem body in either wire profile: ``ietf`` in an RFC 9457
    body, ``error.<stripe>`` in a Stripe body; None if there is none."""
    if "json" not in response.headers.get("content-type", ""):
        return None
    try:
        payload = json.loads(response.content)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    value = error.get(stripe) if isinstance(error, dict) else payload.get(ietf)
    return value if isinstance(value, str) else None


def problem_code(response: httpx.Response) -> str | None:
    """The stable code of a library problem ([`Problem`][idempotence.problems.Problem])."""
    return problem_field(response, "code", "code")


def classify(response: httpx.Response | None, error: Exception | None = None) -> Verdict:
    """The [`Verdict`][idempotence.client.Verdict] on one attempt: ``response``, or the
    ``error`` raised instead of one.

    A transport error (refused, reset, dropped mid-response, timed out) is retried:
    the request may have run, which is why the retry carries the same key. A 429, a
    busy 409 and a fresh 5xx are retried; a 5xx the server replays as stored
    (``Idempotent-Replayed: true``) is final, as is every other answer.

    ```python
    classify(httpx.Response(503))
    # <Verdict.RETRY: 'retry'>
    classify(httpx.Response(500, headers={"Idempotent-Replayed": "true"}))
    # <Verdict.FINAL: 'final'>
    classify(httpx.Response(409, json={"error": {"code": "out_of_stock"}}))
    # <Verdict.FINAL: 'final'>
    classify(None, httpx.ConnectError("refused"))
    # <Verdict.RETRY: 'retry'>
    ```
    """
    if response is None:
        # A request we could not even form is no network failure: never retried.
        local = isinstance(error, httpx.LocalProtocolError | httpx.UnsupportedProtocol)
        retry = isinstance(error, httpx.TransportError) and not local
        return Verdict.RETRY if retry else Verdict.FINAL
    status = response.status_code
    if status in (400, 422) and problem_code(response) == Problem.KEY_REUSED.code:
        return Verdict.KEY_REUSED
    if status == 429:
        return Verdict.RETRY
    if status == 409:
        return Verdict.RETRY if problem_code(response) in _BUSY else Verdict.FINAL
    if status >= 500:
        return Verdict.FINAL if _replayed(response) else Verdict.RETRY
    return Verdict.FINAL


def _replayed(response: httpx.Response) -> bool:
    value: str = response.headers.get(REPLAYED_HEADER, "")
    return value.lower() == "true"


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds from now: delay-seconds or an HTTP-date (RFC 9110
    10.2.3); None when absent or unreadable, never negative.

    ```python
    parse_retry_after("3")
    # 3.0
    parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0)
    # 10.0
    parse_retry_after("soon") is None
    # True
    ```
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = datetime.now(UTC).timestamp() if now is None else now
    return max(0.0, when.timestamp() - current)


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    """How hard the client tries: the limits, and the pauses between attempts.

    The pause after attempt ``n`` (1-based) is the server's ``Retry-After`` when it
    sent one (plus up to ``jitter_fraction`` of it, so clients told the same second
    do not come back together), else full jitter: a uniform draw in
    ``[0, min(max_backoff, base_backoff * 2 ** (n - 1))]``. The operation gives up
    after ``max_attempts`` attempts, or when the next attempt could not start before
    ``deadline`` (counted from the first attempt).

    ```python
    Retry(max_attempts=0)
    # Traceback (most recent call last):
    # idempotence.errors.ConfigurationError: Retry.max_attempts=0 must be >= 1
    ```
    """

    max_attempts: int = 8
    deadline: timedelta = timedelta(seconds=60)
    base_backoff: timedelta = timedelta(milliseconds=100)
    max_backoff: timedelta = timedelta(seconds=10)
    max_retry_after: timedelta = timedelta(seconds=120)
    """A Retry-After longer than this is not waited for: the operation gives up."""
    jitter_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"Retry.max_attempts={self.max_attempts} must be >= 1")
        for name in ("deadline", "base_backoff", "max_backoff", "max_retry_after"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ConfigurationError(f"Retry.{name}={value!r} must be a positive timedelta")
        if not 0 <= self.jitter_fraction <= 1:
            raise ConfigurationError(
                f"Retry.jitter_fraction={self.jitter_fraction} must be between 0 and 1"
            )

    def pause(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait after attempt number ``attempt`` (1-based).

        ```python
        Retry().pause(1, 2.0, random.Random(0)) >= 2.0
        # True
        0 <= Retry().pause(3, None, random.Random(0)) <= 0.4
        # True
        ```
        """
        if retry_after is not None:
            return retry_after * (1 + self.jitter_fraction * rng.random())
        ceiling = min(
            self.max_backoff.total_seconds(),
            self.base_backoff.total_seconds() * 2 ** min(attempt - 1, 62),
        )
        return rng.uniform(0, ceiling)

    def too_long(self, retry_after: float | None) -> bool:
        return retry_after is not None and retry_after > self.max_retry_after.total_seconds()


def clamp_timeout(request: httpx.Request, remaining: float) -> None:
    """Shorten ``request``'s timeouts so that no phase outlasts the ``remaining``
    seconds of the operation's deadline."""
    timeouts = request.extensions.get("timeout", {})
    capped = {
        phase: remaining if timeouts.get(phase) is None else min(timeouts[phase], remaining)
        for phase in ("connect", "read", "write", "pool")
    }
    request.extensions = {**request.extensions, "timeout": capped}


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of an operation, as the ``observe`` hook sees it."""

    number: int
    """1 for the first attempt."""
    key: str
    response: httpx.Response | None
    """The answer, or None when ``error`` (a transport error) took its place."""
    error: Exception | None
    verdict: Verdict
    pause: float | None
    """The pause before the next attempt, or None when this attempt is the last."""


@dataclass(frozen=True, slots=True)
class IdempotentResponse:
    """An operation's final answer, and how it was reached.

    ``replayed`` is True when the server answered from its store (the operation had
    run before, perhaps during an attempt whose answer was lost): the header
    ``Idempotent-Replayed: true`` (P3).
    """

    response: httpx.Response
    key: str
    attempts: int

    @property
    def replayed(self) -> bool:
        return _replayed(self.response)

    @property
    def status_code(self) -> int:
        return self.response.status_code


def key_reused(response: httpx.Response, key: str) -> KeyReused:
    detail = problem_field(response, "detail", "message") or "no detail"
    return KeyReused(
        f"The server refused Idempotency-Key {key!r} with {response.status_code}: it was "
        f"already used for a different request ({detail}). Make a new key for each new "
        "operation, and resend an operation's request unchanged.",
        key=key,
        response=response,
    )


def exhausted(request: httpx.Request, last: Attempt, why: str, elapsed: float) -> RetriesExhausted:
    outcome = f"{last.response.status_code}" if last.response is not None else repr(last.error)
    return RetriesExhausted(
        f"{request.method} {request.url}: no final answer after {last.number} "
        f"attempt{'s' if last.number != 1 else ''} in {elapsed:.1f}s ({why}; the last "
        f"was {outcome}). The operation may have run: retry later with the same "
        f"Idempotency-Key {last.key!r} to learn its outcome, never with a new one.",
        key=last.key,
        attempts=last.number,
        reason=why,
        response=last.response,
        error=last.error,
    )


Prepare = Callable[[httpx.Request, int], httpx.Request]
"""Called before each attempt with the request and the attempt's number (1-based);
returns the request to send (the same one, changed, or another with the same key)."""
Observe = Callable[[Attempt], "bool | None"]
"""Called after each attempt; returning False gives up instead of retrying."""


def new_key() -> str:
    """A fresh key for a new logical operation: a random UUID."""
    return str(uuid.uuid4())


def why_stop(retry: Retry, number: int, retry_after: float | None, late: bool) -> str | None:
    """Why the operation stops retrying after attempt ``number``, or None."""
    if number >= retry.max_attempts:
        return f"max_attempts={retry.max_attempts} reached"
    if retry.too_long(retry_after):
        return f"the server asked to wait {retry_after:.0f}s, beyond max_retry_after"
    if late:
        return "the deadline would pass before the next attempt"
    return None
