"""The life of a guarded request, written once, without I/O.

`lifecycle` is a generator: it yields effects and is sent each effect's
result, or thrown its exception, by the driver (`_driver_async`; `_driver`
is generated from it). Only reading the request is HTTP's own (the effects
`ResolveScope` and `ReadBody`); the rest is a run
of the one engine (F6, [`idempotence.flows`][idempotence.flows]), whose effects the flows driver
performs, and whose [`FlowResult`][idempotence.testing.harness.FlowResult] becomes the reply here,
in the endpoint's wire profile. The ASGI, WSGI and Django middlewares only perform
effects and put bytes on the wire, so every decision of DESIGN 4 and R5 lives here
or in the engine, once:

1. the key (P7, P8): missing, malformed or repeated answers 400; an optional key
   that is absent lets the request through unguarded;
2. the tenant (the scope callable): none answers 401; with ``KeyScope.ENDPOINT`` the
   key's scope is the tenant and the endpoint (method and path);
3. the body: over the limit answers 413 (P7); unreadable as its type answers 400;
4. the run (the engine): the claim, MISMATCH (P2), REPLAY (P3), IN_PROGRESS (P4, or a
   bounded wait, P10), EXECUTE (P1, P5); an unreachable store answers 503 and runs
   nothing (P11); then, by the endpoint's policy, the app with the key settled by
   its status (R5), the app inside one transaction with the claim (F3), or a flow (R1),
   or, for an asynchronous endpoint, the flow started in the background and a 202
   (`_accept`, which also answers GETs of an operation's status URL).

A GET of a key's status URL, when the app turned it on, is answered by `_key_status`.

A response is always buffered before it is sent, so the key is settled (stored,
released or forgotten) before the client sees anything, and in request-as-transaction
mode nothing is sent before the commit. A response larger than ``max_response_bytes``
is never stored truncated (`idempotence.flows.handler.overflowed`).
"""

from __future__ import annotations

import logging
from typing import Any

from .._frozen import quick_new
from ..errors import (
    BodyTooLarge,
    ConfigurationError,
    InvalidBody,
    InvalidKey,
    MissingKey,
    StoreError,
)
from ..fingerprint import fingerprint as fingerprint_of
from ..flows import Flow, FlowResult, ResultKind
from ..flows.flow import watched
from ..states import ClaimRequest
from ._accept import accept, status
from ._config import HTTP_FLOW, Idempotency, KeyScope, Policy
from ._effects import PASS, SENT, Lifecycle, ReadBody, Reply, ReplyKind, ResolveScope
from ._key_status import key_status
from ._problems import Problem, Profile, render_stored
from ._request import (
    RepeatedKey,
    RequestInfo,
    UnsupportedBody,
    declared_length,
    endpoint_scope,
    flow_params,
    form_key,
    framing,
    read_key,
)
from ._responses import (
    DOWN,
    answer,
    finalize,
    no_tenant,
    problem_reply,
    retry_after,
    store_down,
)
from ._scopes import SingleTenant

logger = logging.getLogger("idempotence.http")

# Every answered request makes its reply: past the class call (see quick_new), and the
# kind as a module global (a member read off its enum class costs about five times).
_new_reply = quick_new(Reply)
_RESPOND = ReplyKind.RESPOND

__all__ = ["HTTP_FLOW", "lifecycle"]


# -- the lifecycle ----------------------------------------------------------------------------


def lifecycle(config: Idempotency, policy: Policy, request: RequestInfo, app: Any) -> Lifecycle:
    """Everything a guarded request goes through, as effects (see the module
    docstring). ``app`` runs the application (the exchange of the server
    integration; see [`DoHandle`][idempotence.http.wsgi.DoHandle])."""
    profile = config.profile
    if policy is config.key_status_policy:
        return (yield from key_status(config, request))  # a key's status URL
    if policy.asynchronous and request.method == "GET":
        return (yield from status(config, policy, request))  # an operation's status URL
    field = policy.key_field
    keys, length, content_type = framing(request)
    try:
        # With a key field, a missing header is decided once the body is read.
        key = read_key(keys, required=policy.key_required and field is None)
    except (InvalidKey, MissingKey) as exc:
        return _key_problem(profile, exc)
    if key is None and field is None:
        return PASS  # P7: an optional key, not sent: the request is not guarded
    scope = config.scope_for(policy)  # a constant one is read, not asked of the driver
    tenant = scope.tenant if type(scope) is SingleTenant else (yield ResolveScope(scope, request))
    if tenant is None or tenant == "":
        return no_tenant(profile)
    if not isinstance(tenant, str):
        raise TypeError(f"the scope callable must return a str or None, not {tenant!r}")
    if policy.key_scope is KeyScope.ENDPOINT:
        tenant = endpoint_scope(tenant, request)  # the same key elsewhere is another key
    limit, declared = policy.max_body_bytes, declared_length(length)
    if declared is not None and declared > limit:
        return _too_large(profile, limit)  # before reading a byte (and before 100 Continue)
    try:
        body = yield ReadBody(limit)
    except BodyTooLarge:
        return _too_large(profile, limit)
    exclude = policy.exclude_fields
    if field is not None:
        # The field is left out even when a header carries the key, so a form sent with
        # and without the header is the same request.
        exclude = (*exclude, field)
    if key is None:  # no header, and a key field (else we passed above)
        assert field is not None
        try:
            key = form_key(request, body, field, required=policy.key_required)
        except (InvalidKey, MissingKey) as exc:
            return _key_problem(profile, exc)
        except InvalidBody as exc:
            return problem_reply(profile, Problem.BODY_INVALID, exc.message)
        if key is None:
            return PASS  # P7, as above: an optional key, in neither place
    try:
        fingerprint, previous = _fingerprints(config, request, body, content_type, exclude)
        params = _params(policy, request, body) if policy.flow is not None else {}
    except UnsupportedBody as exc:
        return problem_reply(profile, Problem.BODY_UNSUPPORTED, exc.message)
    except InvalidBody as exc:
        return problem_reply(profile, Problem.BODY_INVALID, exc.message)
    flow = policy.flow
    if flow is not None:
        claim = flow.request(
            scope=tenant,
            key=key,
            fingerprint=fingerprint,
            params=params,
            method=request.method,
            path=request.target,
            previous_fingerprint=previous,
        )
        return (yield from _run_flow(config, policy, flow, claim))
    engine = policy.engine
    assert engine is not None
    claim = engine.request(
        scope=tenant,
        key=key,
        fingerprint=fingerprint,
        method=request.method,
        path=request.target,
        previous_fingerprint=previous,
    )
    assert policy.run is not None
    result = yield from policy.run(claim, app, policy.wait)
    return _reply(policy, profile, result)


def _fingerprints(
    config: Idempotency,
    request: RequestInfo,
    body: bytes,
    content_type: str | None,
    exclude: tuple[str, ...],
) -> tuple[str, str | None]:
    """The request's fingerprint (`request_fingerprint`'s, with the content type
    already read), and while secrets rotate its fingerprint under the previous secret
    (a key stored under that one is this request too)."""
    secret, previous_secret = config.secrets
    method, target = request.method, request.target
    found = fingerprint_of(method, target, body, content_type, exclude=exclude, secret=secret)
    if previous_secret is None:
        return found, None
    previous = fingerprint_of(
        method, target, body, content_type, exclude=exclude, secret=previous_secret
    )
    return found, previous


def _key_problem(profile: Profile, exc: InvalidKey | MissingKey) -> Reply:
    if isinstance(exc, RepeatedKey):
        return problem_reply(profile, Problem.KEY_REPEATED, exc.message)
    if isinstance(exc, MissingKey):
        return problem_reply(profile, Problem.KEY_MISSING, exc.message)
    return problem_reply(profile, Problem.KEY_INVALID, exc.message)


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


def _run_flow(config: Idempotency, policy: Policy, flow: Flow, request: ClaimRequest) -> Lifecycle:
    if policy.asynchronous:
        return (yield from accept(config, policy, flow, request))
    engine = flow.engine(request, wait=policy.wait)
    instrumentation = getattr(config.store, "instrumentation", None)
    try:
        result = yield from watched(instrumentation, flow.name, request, engine)
    except StoreError as exc:  # the claim: nothing ran (P11)
        return store_down(policy, config.profile, exc, rolled_back=False)
    error = result.error
    if result.kind is ResultKind.FAILED and error is not None and not isinstance(error, StoreError):
        logger.error("flow %r failed", flow.name, exc_info=error)
    return _reply(policy, config.profile, result)


def _reply(policy: Policy, profile: Profile, result: FlowResult) -> Reply:
    """The engine's result as the reply, in the endpoint's wire profile."""
    response = result.response
    if result.answered:
        assert response is not None
        return _new_reply(_RESPOND, finalize(response), True)  # original=True
    kind = result.kind
    if kind is ResultKind.SENT:
        return SENT
    if kind is ResultKind.MISMATCH or kind is ResultKind.IN_PROGRESS:
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
    error = result.error
    if kind is ResultKind.FAILED and isinstance(error, StoreError):
        claimed = result.claim is not None or policy.transaction
        # A store the server refuses (StoreMisconfigured) fails closed even so: an
        # outage passes, a wrong URL would run every request unguarded until fixed.
        if (
            not claimed
            and policy.fail_open
            and isinstance(error, DOWN)
            and not isinstance(error, ConfigurationError)
        ):
            logger.warning("key store unavailable, running the request unguarded: %s", error)
            return PASS  # P11: an explicit per-endpoint opt-in
        return store_down(policy, profile, error, rolled_back=claimed)
    assert response is not None
    # A library problem the engine made (R5's 500, R6's 502, F3's too large) or
    # stored comes neutral: the endpoint's profile gives it its wire form (F6).
    replayed = kind is ResultKind.REPLAYED
    return Reply(ReplyKind.RESPOND, finalize(render_stored(profile, response), replayed=replayed))
