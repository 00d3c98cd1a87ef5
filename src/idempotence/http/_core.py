"""The life of a guarded request, written once, without I/O.

:func:`lifecycle` is a generator: it yields effects (read the body, claim the key,
run the app, store the response...) and is sent each effect's result, or thrown its
exception, by a driver (:mod:`._driver_async`; :mod:`._driver` is generated from it).
The ASGI middleware, the WSGI middleware and the Django middleware only perform
effects and put bytes on the wire, so every decision of DESIGN 4 and R5 lives here,
once:

1. the key (P7, P8): missing, malformed or repeated answers 400; an optional key
   that is absent lets the request through unguarded;
2. the tenant (the scope callable): none answers 401;
3. the body: over the limit answers 413 (P7); unreadable as its type answers 400;
4. the claim: MISMATCH (P2), REPLAY (P3), IN_PROGRESS (P4, or a bounded wait, P10),
   EXECUTE (P1, P5); an unreachable store answers 503 and runs nothing (P11);
5. the run, by mode: the app then store/release/forget by status (R5), the app
   inside one transaction with the claim (F3), or a flow (R1).

A response is always buffered before it is sent, so the key is settled (stored,
released or forgotten) before the client sees anything, and in request-as-transaction
mode nothing is sent before the commit. A response larger than ``max_response_bytes``
is never stored truncated: see :func:`_overflow`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from typing import Any

from ..errors import BodyTooLarge, InvalidBody, InvalidKey, LockLost, MissingKey, StoreError
from ..flows import Flow, FlowResult, ResultKind
from ..problems import ProblemDetails
from ..states import Claim, ClaimRequest, Lease, Outcome
from ._config import Idempotency, Mode, Policy
from ._effects import (
    PASS,
    SENT,
    BeginTransaction,
    Captured,
    ClaimKey,
    Effect,
    EndTransaction,
    FinishKey,
    ForgetKey,
    Lifecycle,
    ReadBody,
    ReleaseKey,
    Reply,
    ReplyKind,
    ResolveScope,
    RunApp,
    RunFlow,
    StoreEffect,
    WaitForTwin,
)
from ._problems import Problem, Profile, render_stored
from ._request import (
    KEY_HEADER,
    RepeatedKey,
    RequestInfo,
    UnsupportedBody,
    declared_length,
    flow_params,
    read_key,
    request_fingerprint,
)
from ._responses import (
    DOWN,
    STORED_SERVER_ERROR,
    Action,
    answer,
    as_response,
    classify,
    finalize,
    problem_reply,
    retry_after,
    storable,
    store_down,
)

logger = logging.getLogger("idempotence.http")

#: The flow name recorded on keys of plain and request-as-transaction endpoints. No
#: flow is registered under it, so the completer leaves such keys to client retries.
HTTP_FLOW = "http"
_FIRST_POLL, _MAX_POLL = 0.005, 0.25


class _Waiter:
    """P10: the pauses of a bounded wait for a twin; none without ``policy.wait``."""

    __slots__ = ("deadline", "delay", "wait")

    def __init__(self, policy: Policy) -> None:
        self.wait = None if policy.wait is None else policy.wait.total_seconds()
        self.deadline: float | None = None
        self.delay = _FIRST_POLL

    def pause(self) -> float | None:
        """Seconds to wait before claiming again, or None: answer now."""
        if self.wait is None:
            return None
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.wait
        left = self.deadline - now
        if left <= 0:
            return None
        pause, self.delay = min(self.delay, left), min(self.delay * 2, _MAX_POLL)
        return pause


# -- the lifecycle ----------------------------------------------------------------------------


def lifecycle(config: Idempotency, policy: Policy, request: RequestInfo) -> Lifecycle:
    """Everything a guarded request goes through, as effects (see the module docstring)."""
    profile = config.profile
    try:
        key = read_key(request.header_values(KEY_HEADER), required=policy.key_required)
    except RepeatedKey as exc:
        return problem_reply(profile, Problem.KEY_REPEATED, exc.message)
    except MissingKey as exc:
        return problem_reply(profile, Problem.KEY_MISSING, exc.message)
    except InvalidKey as exc:
        return problem_reply(profile, Problem.KEY_INVALID, exc.message)
    if key is None:
        return PASS  # P7: an optional key, not sent: the request is not guarded
    tenant = yield ResolveScope(config.scope_for(policy), request)
    if tenant is None or tenant == "":
        return problem_reply(
            profile,
            Problem.TENANT_UNKNOWN,
            "This request carries no account to scope its Idempotency-Key to: "
            "authenticate, then retry with the same key.",
        )
    if not isinstance(tenant, str):
        raise TypeError(f"the scope callable must return a str or None, not {tenant!r}")
    limit = policy.max_body_bytes
    declared = declared_length(request)
    if declared is not None and declared > limit:
        return _too_large(profile, limit)  # before reading a byte (and before 100 Continue)
    try:
        body = yield ReadBody(limit)
    except BodyTooLarge:
        return _too_large(profile, limit)
    try:
        fingerprint = request_fingerprint(request, body, policy.exclude_fields)
        params = _params(policy, request, body) if policy.flow is not None else {}
    except UnsupportedBody as exc:
        return problem_reply(profile, Problem.BODY_UNSUPPORTED, exc.message)
    except InvalidBody as exc:
        return problem_reply(profile, Problem.BODY_INVALID, exc.message)
    if policy.flow is not None:
        claim = policy.flow.request(
            scope=tenant,
            key=key,
            fingerprint=fingerprint,
            params=params,
            method=request.method,
            path=request.target,
        )
        return (yield from _run_flow(policy, profile, policy.flow, claim))
    claim = ClaimRequest(
        scope=tenant,
        key=key,
        fingerprint=fingerprint,
        method=request.method,
        path=request.target,
        flow=HTTP_FLOW,
        lock_timeout=policy.lock_timeout,
        retention=policy.retention,
    )
    if policy.mode is Mode.TRANSACTION:
        return (yield from _in_transaction(policy, profile, claim))
    return (yield from _handler(policy, profile, claim))


def _too_large(profile: Profile, limit: int) -> Reply:
    return problem_reply(
        profile,
        Problem.BODY_TOO_LARGE,
        f"The request body is larger than this endpoint accepts ({limit} bytes): "
        "send a smaller body.",
    )


def _params(policy: Policy, request: RequestInfo, body: bytes) -> Any:
    parsed = flow_params(request, body)
    return parsed if policy.flow_params is None else policy.flow_params(request, parsed)


def _claim(
    policy: Policy, profile: Profile, request: ClaimRequest
) -> Generator[Effect, Any, Claim | Reply]:
    waiter = _Waiter(policy)
    while True:
        try:
            claim: Claim = yield ClaimKey(request)
        except StoreError as exc:
            if policy.fail_open and isinstance(exc, DOWN):
                logger.warning("key store unavailable, running %s unguarded: %s", request.path, exc)
                return PASS  # P11: an explicit per-endpoint opt-in
            return store_down(policy, profile, exc, rolled_back=False)
        if claim.outcome is not Outcome.IN_PROGRESS:
            return claim
        pause = waiter.pause()
        if pause is None:
            return claim
        yield WaitForTwin(request, pause)


def _settle(effect: StoreEffect) -> Generator[Effect, Any, None]:
    """Settle the key after the app ran. A failure cannot change the answer any more
    (the app's effects happened), so it is logged; the lock then expires and a retry
    takes the key over (P5)."""
    try:
        yield effect
    except LockLost as exc:
        logger.warning("key was taken over while the app ran: %s", exc)
    except StoreError as exc:
        logger.error("could not settle the key after the app ran: %s", exc, exc_info=exc)


def _handler(policy: Policy, profile: Profile, request: ClaimRequest) -> Lifecycle:
    got = yield from _claim(policy, profile, request)
    if isinstance(got, Reply):
        return got
    if got.outcome is not Outcome.EXECUTE:
        return answer(got, policy, profile)
    assert got.lease is not None
    lease = got.lease
    try:
        captured: Captured = yield RunApp(
            policy.max_response_bytes,
            lease,
            in_transaction=False,
            on_overflow=lambda status: _overflow(policy, lease, status),
        )
    except Exception:
        # R5: an exception stores nothing (unless the endpoint stores server errors),
        # so a retry runs the request again; the framework answers the 500.
        if policy.store_server_errors:
            yield from _settle(FinishKey(lease, STORED_SERVER_ERROR))
        else:
            yield from _settle(ReleaseKey(lease))
        raise
    if captured.overflowed:
        return SENT
    action = classify(policy, captured.status)
    if action is Action.STORE:
        yield from _settle(FinishKey(lease, storable(policy, captured)))
    elif action is Action.RELEASE:
        yield from _settle(ReleaseKey(lease))
    else:
        yield from _settle(ForgetKey(lease))
    return Reply(ReplyKind.RESPOND, finalize(as_response(captured)), original=True)


def _overflow(policy: Policy, lease: Lease, status: int) -> StoreEffect:
    """A response too large to store, in handler mode: the app's effects happened, so
    the response is sent once, streamed, and never stored truncated. A key that would
    have been stored is finished with a problem instead, marked errored for an
    operator (the limit is too small), so a retry is told what happened and never
    runs the request a second time."""
    action = classify(policy, status)
    if action is Action.RELEASE:
        return ReleaseKey(lease)
    if action is Action.FORGET:
        return ForgetKey(lease)
    limit = policy.max_response_bytes
    detail = (
        f"This request was processed once, but its response was larger than this endpoint "
        f"stores ({limit} bytes), so it cannot be replayed. It will not be processed "
        "again: look its result up through the API."
    )
    response = ProblemDetails.of(Problem.RESPONSE_NOT_REPLAYABLE, detail).stored()
    reason = f"response with status {status} larger than max_response_bytes={limit}: sent once"
    return FinishKey(lease, response, error=reason)


def _in_transaction(policy: Policy, profile: Profile, request: ClaimRequest) -> Lifecycle:
    """F3: the claim, the app's writes and the stored response commit together. A
    duplicate racing it blocks on the key's row (PostgreSQL) or on the write lock
    (SQLite) until the commit, then replays; if the first rolls back, it executes."""
    waiter = _Waiter(policy)
    while True:
        try:
            claim: Claim = yield BeginTransaction(request)
        except StoreError as exc:
            return store_down(policy, profile, exc, rolled_back=False)
        if claim.outcome is Outcome.EXECUTE:
            return (yield from _execute_in_transaction(policy, profile, claim))
        yield EndTransaction(commit=False)
        pause = waiter.pause() if claim.outcome is Outcome.IN_PROGRESS else None
        if pause is None:
            return answer(claim, policy, profile)
        yield WaitForTwin(request, pause)


def _execute_in_transaction(policy: Policy, profile: Profile, claim: Claim) -> Lifecycle:
    assert claim.lease is not None
    lease = claim.lease
    try:
        captured: Captured = yield RunApp(
            policy.max_response_bytes, lease, in_transaction=True, on_overflow=None
        )
    except Exception:
        yield EndTransaction(commit=False)  # the app's writes roll back with the claim
        raise
    if captured.overflowed:
        # Nothing was sent yet, so the request can be refused whole: roll back.
        yield EndTransaction(commit=False)
        return problem_reply(
            profile,
            Problem.RESPONSE_TOO_LARGE,
            f"The response was larger than this endpoint can store "
            f"({policy.max_response_bytes} bytes), so the request was rolled back and "
            "nothing was done. Retrying it will fail the same way; contact the operator.",
        )
    reply = Reply(ReplyKind.RESPOND, finalize(as_response(captured)), original=True)
    if classify(policy, captured.status) is not Action.STORE:
        # R5: a rejected or failed request leaves nothing behind, not even its claim.
        yield EndTransaction(commit=False)
        return reply
    yield FinishKey(lease, storable(policy, captured), at_commit=True)
    try:
        yield EndTransaction(commit=True)
    except StoreError as exc:
        # The finish was refused (the key was taken over: everything rolled back), or
        # the commit lost its connection and whether it took effect is unknown; either
        # way a retry is safe: it replays, or executes the first time.
        return store_down(policy, profile, exc, rolled_back=True)
    return reply


def _run_flow(policy: Policy, profile: Profile, flow: Flow, request: ClaimRequest) -> Lifecycle:
    waiter = _Waiter(policy)
    while True:
        try:
            result: FlowResult = yield RunFlow(flow, request)
        except StoreError as exc:
            return store_down(policy, profile, exc, rolled_back=False)
        kind = result.kind
        if kind is ResultKind.IN_PROGRESS:
            pause = waiter.pause()
            if pause is not None:
                yield WaitForTwin(request, pause)
                continue
        if kind in (ResultKind.MISMATCH, ResultKind.IN_PROGRESS):
            assert result.claim is not None
            return answer(result.claim, policy, profile)
        if kind is ResultKind.LOST:
            return problem_reply(
                profile,
                Problem.KEY_TAKEN_OVER,
                "Another worker took this request over while it ran. Retry with the same "
                "Idempotency-Key to get its outcome.",
                retry_after(policy.in_progress_retry_after),
            )
        if kind is ResultKind.FAILED and isinstance(result.error, StoreError):
            return store_down(policy, profile, result.error, rolled_back=True)
        if result.error is not None and kind is ResultKind.FAILED:
            logger.error("flow %r failed", flow.name, exc_info=result.error)
        assert result.response is not None
        # A library problem the flow made (R5's 500, R6's 502) or stored comes
        # neutral: the endpoint's profile gives it its wire form (F6).
        response = render_stored(profile, result.response)
        return Reply(ReplyKind.RESPOND, finalize(response, replayed=kind is ResultKind.REPLAYED))
