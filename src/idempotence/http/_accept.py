"""Asynchronous acceptance, without I/O: a long flow answers 202 at once and runs in
the background; its status URL answers 202 until it finishes, then its stored
response.

The first request claims the key like any flow request (P1), stores the flow's
parameters with it, releases it unfinished, starts the flow in the background
(`Detach`: the engine's own run, ``flow.run_async``, which takes
the released key over, P5) and answers 202 with ``Location`` (the status URL) and
``Retry-After``. Nothing else runs it but that background run and the completer
(B2), which finishes the key if the server dies mid-flow: a retry with the same key,
or a GET of the status URL, only reads the key (`ReadKey`) and
never takes it, so a long flow is never run by a request:

* another request with the key (another body, method or path): 422 (P2);
* a finished key: its stored response, marked ``Idempotent-Replayed`` (P3);
* anything else (running, or released by a crash and waiting for the completer): 202.
"""

from __future__ import annotations

import json

from ..errors import InvalidKey, StoreError
from ..flows import Flow, ResultKind
from ..keys import validate_key
from ..states import Claim, ClaimRequest, KeyRecord, Outcome, StoredResponse, settled
from ._config import Idempotency, Policy
from ._effects import Detach, Lifecycle, ReadKey, Reply, ReplyKind, ResolveScope
from ._problems import Problem
from ._request import RequestInfo
from ._responses import answer, finalize, no_tenant, problem_reply, retry_after, store_down

__all__ = ["accept", "status"]


def accept(config: Idempotency, policy: Policy, flow: Flow, request: ClaimRequest) -> Lifecycle:
    """A request to an asynchronous flow endpoint (see the module docstring)."""
    try:
        record = yield ReadKey(request.scope, request.key)
        if record is None:
            # The engine's own handover: claimed, and released before the 202, so the
            # key is the completer's if the background run never starts (the server
            # dies now): nothing is lost.
            result = yield from flow.handover(request)
            if result.kind is ResultKind.PAUSED:
                yield Detach(flow, request)
                return accepted(config, policy, request.key)
            assert result.claim is not None
            return _answer(config, policy, result.claim)
    except StoreError as exc:
        return store_down(policy, config.profile, exc, rolled_back=False)
    fingerprint = request.fingerprint
    if record.fingerprint == request.previous_fingerprint:
        fingerprint = record.fingerprint  # stored under the previous secret: this request
    return _known(config, policy, record, fingerprint)


def status(config: Idempotency, policy: Policy, request: RequestInfo) -> Lifecycle:
    """A GET of an operation's status URL: 202 while it runs, then its response."""
    profile = config.profile
    try:
        key = validate_key(request.path_params["key"])
    except InvalidKey as exc:
        return problem_reply(profile, Problem.KEY_INVALID, exc.message)
    tenant = yield ResolveScope(config.scope_for(policy), request)
    if not tenant:
        return no_tenant(profile)
    try:
        record = yield ReadKey(tenant, key)
    except StoreError as exc:
        return store_down(policy, profile, exc, rolled_back=False)
    if record is None or record.flow not in config.status_flows:
        return problem_reply(
            profile,
            Problem.OPERATION_UNKNOWN,
            f"No asynchronous operation has the Idempotency-Key {key!r} for this account: "
            "check the key, or start the operation first.",
        )
    return _known(config, policy, record, None)


def _known(
    config: Idempotency, policy: Policy, record: KeyRecord, fingerprint: str | None
) -> Reply:
    """The answer for a key read, not claimed: what its row decides whatever its lock
    says (`settled`: 422, its stored response), else 202.
    A status URL's GET has no request to compare (``fingerprint`` None)."""
    outcome = settled(record, record.fingerprint if fingerprint is None else fingerprint)
    if outcome is None:
        return accepted(config, policy, record.key)
    return _answer(config, policy, Claim(outcome, record))


def _answer(config: Idempotency, policy: Policy, claim: Claim) -> Reply:
    """A claim this request did not win: 422, the stored response, or 202 while the
    key is held (by the background run, or waiting for the completer)."""
    if claim.outcome is Outcome.IN_PROGRESS:
        return accepted(config, policy, claim.record.key)
    return answer(claim, policy, config.profile)


def accepted(config: Idempotency, policy: Policy, key: str) -> Reply:
    """202 Accepted: where to read the outcome, and when to come back."""
    url = config.status_url(key)
    seconds = policy.in_progress_retry_after
    body = json.dumps({"status": "accepted", "idempotency_key": key, "location": url})
    headers = (
        ("content-type", "application/json"),
        ("location", url),
        ("content-location", url),
        *retry_after(seconds),
    )
    return Reply(ReplyKind.RESPOND, finalize(StoredResponse(202, headers, body.encode())))
