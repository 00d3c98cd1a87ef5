"""A key's status URL, without I/O: ``GET <key_status_path>/<key>`` reads the key's
status ([`KeyStatus`][idempotence.states.KeyStatus]) on the store's clock and answers

* 200 with its state, its times and its stored status code, as JSON (never the stored
  body: a status is for whoever may ask after the key);
* 404 (``idempotency_key_unknown``) when the tenant holds no such key: never sent,
  refused before it ran, or deleted after its retention;
* 410 (``idempotency_key_expired``) once its retention has passed, before the reaper
  deletes it. A retry of the request still replays until then (docs/design.md, B3):
  the 410 says that the key may be forgotten at any moment, not that it already is.

The key is looked up where a request would have stored it: under the tenant of the
scope callable, and, for a key sent to an endpoint whose policy has its own scope or
keeps keys per endpoint, under that endpoint's, named by the client with
``?method=POST&path=/v1/orders``. No tenant sees another's keys.
"""

from __future__ import annotations

import json
import urllib.parse
from datetime import UTC, datetime

from ..errors import InvalidKey, StoreError
from ..keys import validate_key
from ..states import KeyState, KeyStatus, StoredResponse
from ._config import _SAFE_METHODS, Idempotency, KeyScope, Policy
from ._effects import Lifecycle, ReadStatus, Reply, ReplyKind, ResolveScope
from ._problems import Problem
from ._request import RequestInfo, endpoint_scope
from ._responses import finalize, no_tenant, problem_reply, store_down

__all__ = ["key_status"]

_MAX_QUERY_FIELDS = 8
"""A status URL's query names its endpoint in two fields; more is refused past this."""
_MAX_PATH = 2048
"""The longest endpoint path a status URL may name."""


class _BadQuery(ValueError):
    """The status URL's query does not name an endpoint: its message says why."""


def key_status(config: Idempotency, request: RequestInfo) -> Lifecycle:
    """A GET of a key's status URL (see the module docstring)."""
    profile = config.profile
    try:
        key = validate_key(request.path_params["key"], subject="The status URL's key")
    except InvalidKey as exc:
        return problem_reply(profile, Problem.KEY_INVALID, exc.message)
    try:
        endpoint = _endpoint(request.query)
        policy = _policy(config, endpoint)
    except _BadQuery as exc:
        return problem_reply(profile, Problem.STATUS_QUERY_INVALID, str(exc))
    tenant = yield ResolveScope(config.scope_for(policy), request)
    if tenant is None or tenant == "":
        return no_tenant(profile)
    if not isinstance(tenant, str):
        raise TypeError(f"the scope callable must return a str or None, not {tenant!r}")
    scope = tenant
    if endpoint is not None and policy.key_scope is KeyScope.ENDPOINT:
        scope = endpoint_scope(tenant, endpoint)
    try:
        status: KeyStatus | None = yield ReadStatus(scope, key)
    except StoreError as exc:
        return store_down(policy, profile, exc, rolled_back=False)
    if status is None:
        return problem_reply(profile, Problem.KEY_UNKNOWN, _unknown(config, key, endpoint))
    if status.state is KeyState.EXPIRED:
        return problem_reply(profile, Problem.KEY_EXPIRED, _expired(key, status))
    return _found(key, status)


def _endpoint(query: str) -> RequestInfo | None:
    """The endpoint the query names (``method`` and ``path``), or None."""
    if not query:
        return None
    try:
        fields = urllib.parse.parse_qsl(
            query, keep_blank_values=True, errors="strict", max_num_fields=_MAX_QUERY_FIELDS
        )
    except ValueError:  # too many fields, or bytes that are not UTF-8
        raise _BadQuery(
            "The status URL's query cannot be read: send at most method= and path=, "
            "percent-encoded UTF-8."
        ) from None
    named: dict[str, str] = {}
    for name, value in fields:
        if name not in ("method", "path"):
            continue  # a cache-buster, or any other field: not ours
        if name in named:
            raise _BadQuery(f"The status URL's query has {name}= twice: send it once.")
        named[name] = value
    if not named:
        return None
    if len(named) == 1:
        raise _BadQuery(
            "The status URL's query names half an endpoint: send both method= and path= "
            "(as ?method=POST&path=/v1/orders), or neither."
        )
    method, path = named["method"].upper(), named["path"]
    if not method.isascii() or not method.isalpha() or len(method) > 16:
        raise _BadQuery("The status URL's method= is not an HTTP method: send one as POST.")
    if method in _SAFE_METHODS:
        raise _BadQuery(
            f"The status URL's method={method} is never guarded, so it has no keys: name "
            "the method the key was sent with (POST, PATCH...)."
        )
    if not path.startswith("/") or len(path) > _MAX_PATH:
        raise _BadQuery(
            f"The status URL's path= must be the path the key was sent to, starting with "
            f"'/' and at most {_MAX_PATH} characters."
        )
    return RequestInfo(method, path)


def _policy(config: Idempotency, endpoint: RequestInfo | None) -> Policy:
    """The policy that stored the key: the named endpoint's, or (none named) the
    status route's own, which reads the tenant with ``Idempotency.scope``."""
    own = config.key_status_policy
    assert own is not None
    if endpoint is None:
        return own
    found = config.resolve(endpoint.method, endpoint.path)
    if found is None:
        raise _BadQuery(
            f"{endpoint.method} {endpoint.path} is not guarded by an Idempotency-Key here, "
            "so it has no keys: name the method and path the key was sent to."
        )
    return found[0]


def _unknown(config: Idempotency, key: str, endpoint: RequestInfo | None) -> str:
    detail = (
        f"No request with the Idempotency-Key {key!r} is known for this account: it was "
        "never sent, it was refused before it ran, or it was deleted after its retention."
    )
    if endpoint is None and _has_own_scopes(config):
        detail += (
            " A key sent to an endpoint that keeps its keys apart is found with that "
            "endpoint named: ?method=POST&path=/the/path."
        )
    return detail


def _has_own_scopes(config: Idempotency) -> bool:
    policies = [endpoint.policy for endpoint in config.endpoints] + [config.default]
    return any(
        policy is not None and (policy.scope is not None or policy.key_scope is KeyScope.ENDPOINT)
        for policy in policies
    )


def _expired(key: str, status: KeyStatus) -> str:
    assert status.expires_at is not None  # EXPIRED: past its expiry
    until = (
        "A retry of its request still gets the stored response"
        if status.response_status is not None
        else "It never finished: a retry of its request resumes it"
    )
    return (
        f"The Idempotency-Key {key!r} is past its retention (it expired at "
        f"{_time(status.expires_at)}). {until} until the key is deleted, which may happen "
        "at any moment; after that, a request with this key runs as a new request."
    )


def _found(key: str, status: KeyStatus) -> Reply:
    body = {
        "idempotency_key": key,
        "state": status.state.value,
        "created_at": _time(status.created_at),
        "finished_at": _time(status.finished_at),
        "expires_at": _time(status.expires_at),
        "response_status": status.response_status,
    }
    headers = (("content-type", "application/json"), ("cache-control", "no-store"))
    data = json.dumps(body, ensure_ascii=True).encode("ascii")
    return Reply(ReplyKind.RESPOND, finalize(StoredResponse(200, headers, data)))


def _time(at: datetime | None) -> str | None:
    """An RFC 3339 UTC time, to the millisecond."""
    if at is None:
        return None
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
