"""How a phase ends (R2) and how a run of a flow ends."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import TypeAlias

from .._frozen import quick_init, quick_new
from ..problems import Problem, ProblemDetails
from ..states import Claim, Outcome, StoredResponse, new_response

# -- what a phase returns (R2) ----------------------------------------------------------


@quick_init
@dataclass(frozen=True, slots=True)
class Advance:
    """Commit the phase and continue from ``recovery_point``."""

    recovery_point: str


@quick_init
@dataclass(frozen=True, slots=True)
class Finish:
    """Commit the phase and store ``response``: the key is finished. A status of 400
    or more is a terminal answer too, stored and replayed (R5: a declined card)."""

    response: StoredResponse


@quick_init
@dataclass(frozen=True, slots=True)
class NoOp:
    """Commit the phase's writes, keep the recovery point, and end this attempt: the
    key is unlocked and the next attempt (a retry, the completer) resumes here. The
    caller gets an unstored 202."""


PhaseResult: TypeAlias = Advance | Finish | NoOp
"""What a phase returns: go on to the next step, finish with a response, or nothing to
do."""


# -- results ----------------------------------------------------------------------------


class ResultKind(enum.Enum):
    """How a run of a flow ended."""

    EXECUTED = "executed"
    """This run finished the key; ``response`` is stored."""
    REPLAYED = "replayed"
    """The key was finished before; ``response`` is the stored one (P3)."""
    MISMATCH = "mismatch"
    """The key belongs to another request (P2)."""
    IN_PROGRESS = "in_progress"
    """Another worker holds the key (P4)."""
    LOST = "lost"
    """Another worker took the key over during this run; this run's writes were
    refused (F1)."""
    FAILED = "failed"
    """An unexpected error: rolled back, unlocked, ``response`` (500) not stored
    unless the flow stores server errors (R5)."""
    REJECTED = "rejected"
    """The request was refused before its first phase committed: nothing stored (R5)."""
    PAUSED = "paused"
    """A phase returned NoOp: unlocked, to be resumed."""
    ERRORED = "errored"
    """A non-idempotent foreign call failed indeterminately: stored, flagged (R6)."""
    SENT = "sent"
    """An application handler's response was too large to store: the key was settled
    (`overflowed`) and the response went out streamed, as it came."""


@quick_init
@dataclass(frozen=True, slots=True)
class FlowResult:
    """The end of one run of a flow."""

    kind: ResultKind
    claim: Claim | None
    """The claim this run made; None when a request-as-transaction run rolled back
    (its claim with it)."""
    response: StoredResponse | None = None
    """The response to send; None for MISMATCH, IN_PROGRESS and LOST, whose wire
    form depends on the HTTP profile. A library problem (FAILED's 500, ERRORED's
    502) is in neutral form: `from_stored`
    reads it, and the HTTP layer renders it in the endpoint's profile (F6)."""
    stored: bool = False
    """Whether ``response`` is the stored one (replayed to every retry)."""
    error: BaseException | None = None
    """The exception behind FAILED, ERRORED or LOST."""
    answered: bool = False
    """``response`` is an application handler's own answer, to be sent as the app
    made it (all its headers), not a stored or a library response (F6)."""


new_result = quick_new(FlowResult)
"""A FlowResult from all six fields, in order, past the class call (see `quick_new`):
for the results every call ends with (executed, replayed)."""


def problem(status: int, title: str, detail: str) -> StoredResponse:
    """An RFC 9457 problem response of the application's own (a declined card): stored
    and replayed verbatim, whatever the endpoint's wire profile. The library's own
    problems are `ProblemDetails` instead."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    return StoredResponse.of(
        status, {"content-type": "application/problem+json"}, json.dumps(body).encode()
    )


SERVER_ERROR = ProblemDetails.of(
    Problem.SERVER_ERROR,
    "The request failed and nothing of it was stored. Retry with the same "
    "Idempotency-Key: the work resumes from its last completed step.",
).stored()
"""R5: what a run that raised answers, in neutral form (rendered at the edge, F6)."""
PAUSED_RESPONSE = StoredResponse.of(202, {"retry-after": "1"}, b"")
"""The answer of a run whose phase returned [`NoOp`][idempotence.NoOp] (202, retry
after a second): the key stays unfinished, so a retry with the same key, or the
background completer, resumes it."""
STORED_SERVER_ERROR = ProblemDetails.of(
    Problem.SERVER_ERROR,
    "The request failed with an unexpected error. Retrying it returns this answer.",
).stored()
"""R5: what a handler that raised stores on a run that stores server errors; neutral,
so every replay renders it in the endpoint's profile."""


@quick_init
@dataclass(frozen=True, slots=True)
class Captured:
    """What an application handler answered: status, headers (as sent), body.
    ``overflowed``: the body was larger than the handler step stores (its ``body`` is
    then empty)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    overflowed: bool = False

    def response(self) -> StoredResponse:
        """The answer as the handler made it, every header included."""
        return new_response(self.status, self.headers, self.body)


new_captured = quick_new(Captured)
"""A Captured from all four fields, in order, past the class call (see `quick_new`):
a guarded function's answer, once per call."""


def indeterminate_response(name: str) -> StoredResponse:
    """R6: what a key errored by foreign call ``name`` answers, in neutral form."""
    return ProblemDetails.of(
        Problem.OUTCOME_UNKNOWN,
        f"The call {name!r} to an external system may or may not have taken effect, and "
        "it cannot be repeated safely. The request is on hold for an operator; retrying "
        "it will return this answer.",
    ).stored()


def from_claim(claim: Claim) -> FlowResult:
    """The result of a run whose claim it did not win (P2, P3, P4)."""
    outcome = claim.outcome  # compared, not looked up: an Enum hashes in Python
    if outcome is Outcome.REPLAY:
        return new_result(ResultKind.REPLAYED, claim, claim.response, True, None, False)
    if outcome is Outcome.MISMATCH:
        return FlowResult(ResultKind.MISMATCH, claim)
    if outcome is Outcome.IN_PROGRESS:
        return FlowResult(ResultKind.IN_PROGRESS, claim)
    raise KeyError(outcome)
