"""The middleware's configuration: a [`Policy`][idempotence.http.Policy] per endpoint,
[`Endpoint`][idempotence.http.Endpoint] patterns that choose it, and
[`Idempotency`][idempotence.http.wsgi.Idempotency], which holds them with the store, the
scope and the wire profile.

```python
config = Idempotency(
    store=store,
    scope=lambda request: request.header("x-account-id"),
    endpoints=[
        Endpoint("POST /v1/transfers", Policy(transaction=True)),
        Endpoint("POST /v1/webhooks/{source}", None),     # never guarded
    ],
)
```

Every value is checked when it is built, so a wrong setting fails at import time
with a message that names it, never on the first request.
"""

from __future__ import annotations

import enum
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeAlias

from ..errors import ConfigurationError
from ..fingerprint import secret_pair
from ..flows.effects import Engine
from ..flows.flow import Flow
from ..states import DEFAULT_HANDLER_LOCK_TIMEOUT, DEFAULT_RETENTION, ClaimRequest
from ..stores import AsyncKeyStore, KeyStore
from ..stores.capabilities import Capability, capabilities_of
from ._problems import Profile
from ._request import RequestInfo
from ._scopes import ScopeFn, header_scope, single_tenant

__all__ = [
    "DEFAULT_METHODS",
    "DEFAULT_REJECTED_STATUSES",
    "DEFAULT_REPLAY_HEADERS",
    "Endpoint",
    "Idempotency",
    "KeyScope",
    "Mode",
    "Policy",
    "ScopeFn",
    "header_scope",
    "single_tenant",
]

ParamsFn: TypeAlias = Callable[[RequestInfo, Any], Any]
"""A flow's parameters from the request and its parsed body."""
_Run: TypeAlias = Callable[[ClaimRequest, Any, timedelta | None], Engine]

DEFAULT_METHODS = frozenset({"POST", "PATCH"})
"""P9: the methods guarded unless configured otherwise."""
DEFAULT_REJECTED_STATUSES = frozenset({400, 401, 403, 404, 405, 413, 415, 422, 429})
"""Statuses that mean "the request was refused as sent": nothing is stored, so the
client can correct the request and retry with the same key (R5)."""
DEFAULT_REPLAY_HEADERS = ("content-type", "content-encoding", "location")
"""Response headers always stored for replay; everything else (Set-Cookie above all)
only when an endpoint lists it in ``replay_headers``."""

HTTP_FLOW = "http"
"""The flow name recorded on keys of handler and request-as-transaction endpoints. No
flow is registered under it, so the completer leaves such keys to client retries."""

_ANY = frozenset({"*"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# Headers that describe one transfer, not the response: never stored.
_NEVER_STORED = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "idempotent-replayed"}
)
_MIB = 1024 * 1024


class Mode(enum.Enum):
    """How a guarded endpoint runs."""

    HANDLER = "handler"
    """Claim, run the app, store its captured response."""
    TRANSACTION = "transaction"
    """F3: claim, the app's writes and the stored response commit in ONE transaction."""
    FLOW = "flow"
    """A registered multi-phase flow is the handler (R1); the app is not called."""


class KeyScope(enum.Enum):
    """Where a key is unique (DESIGN 2, P2).

    ``TENANT`` (the default): a key names one operation of the tenant, whatever the
    endpoint, so the same key sent to another endpoint is refused 422 (P2): it catches
    a client that reuses keys by mistake. ``ENDPOINT``: a key is unique per tenant,
    method and path, so the same key on two endpoints gives two independent results,
    as some clients expect. The key row's scope is then ``"<tenant> <METHOD> <path>"``
    (the path percent-encoded, so the tenant is everything before the last two
    spaces): that is the ``scope`` a lease, a phase and the admin CLI see.
    """

    TENANT = "tenant"
    ENDPOINT = "endpoint"


def _invalid(owner: str, name: str, value: object, why: str) -> ConfigurationError:
    return ConfigurationError(f"{owner}.{name}={value!r} {why}")


def _key_scope(owner: str, value: KeyScope | str) -> KeyScope:
    try:
        return KeyScope(value)
    except ValueError:
        raise _invalid(owner, "key_scope", value, "must be 'tenant' or 'endpoint'") from None


def _methods(owner: str, methods: Iterable[str]) -> frozenset[str]:
    if isinstance(methods, str):
        methods = [methods]
    upper = frozenset(method.upper() for method in methods)
    if not upper:
        raise _invalid(owner, "methods", methods, "is empty: guard at least one method")
    safe = sorted(upper & _SAFE_METHODS)
    if safe:
        raise _invalid(
            owner,
            "methods",
            sorted(upper),
            f"includes {', '.join(safe)}: safe methods are idempotent already; "
            "guard POST, PATCH (or PUT, DELETE)",
        )
    return upper


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """How one endpoint is guarded. Every field has a named default.

    ```python
    Policy(transaction=True).mode
    # <Mode.TRANSACTION: 'transaction'>
    Policy(max_body_bytes=-1)
    # Traceback (most recent call last):
    # idempotence.errors.ConfigurationError: Policy.max_body_bytes=-1 must be >= 0
    ```
    """

    methods: frozenset[str] = DEFAULT_METHODS
    """P9: methods guarded when this policy is the default (an endpoint pattern that
    names its methods overrides it). Others pass through untouched."""
    key_required: bool = True
    """P7: True answers a request without a key 400; False lets it through unguarded."""
    scope: ScopeFn | None = None
    """Overrides `Idempotency.scope` for this endpoint."""
    key_scope: KeyScope = KeyScope.TENANT
    """Where a key is unique: per tenant (default: another endpoint answers 422, P2), or
    per tenant and endpoint ([`KeyScope`][idempotence.http.KeyScope]; ``"endpoint"`` is
    accepted)."""
    exclude_fields: tuple[str, ...] = ()
    """Body fields left out of the fingerprint: JSON names or dotted paths, form names."""
    key_field: str | None = None
    """The form field holding the key when no Idempotency-Key header is sent (HTML forms),
    always left out of the fingerprint; a header sent too wins over it."""
    lock_timeout: timedelta = DEFAULT_HANDLER_LOCK_TIMEOUT
    """How long a silent worker keeps the key before a retry may take it over (P4, P5).
    A running handler's lock is extended every ``heartbeat`` (F2), so this bounds
    only how long a crashed server's keys answer 409, not how long a handler may run."""
    heartbeat: timedelta | None = None
    """F2: extend a running handler's lock this often; None: every lock_timeout / 3."""
    retention: timedelta | None = DEFAULT_RETENTION
    """How long a finished key replays; None keeps it forever."""
    max_body_bytes: int = _MIB
    """P7: larger request bodies are answered 413 before anything is claimed."""
    max_response_bytes: int = _MIB
    """Larger responses are not stored (the guide "Tune an endpoint's policy" says what
    happens to them, under "Large responses")."""
    fail_open: bool = False
    """P11: run the handler unguarded when the store is unreachable (default: 503)."""
    store_server_errors: bool = False
    """R5: store a 5xx (and an exception's 500) like Stripe, instead of letting the
    next retry run again."""
    rejected_statuses: frozenset[int] = DEFAULT_REJECTED_STATUSES
    """4xx statuses that store nothing, so the client can fix and retry (R5)."""
    replay_headers: tuple[str, ...] = ()
    """Response headers stored for replay in addition to DEFAULT_REPLAY_HEADERS."""
    wait: timedelta | None = None
    """P10: wait this long for a twin to finish, then replay, instead of 409 at once."""
    transaction: bool = False
    """F3: claim, the app's writes and the response commit in one transaction."""
    flow: Flow | None = None
    """A registered flow that handles the endpoint instead of the app."""
    flow_params: ParamsFn | None = None
    """The flow's parameters from ``(request, parsed body)``; default: the body."""
    asynchronous: bool = False
    """Asynchronous acceptance (a flow endpoint only): the first request starts the
    flow in the background and answers 202 with the operation's status URL
    (`Idempotency.status_path`); a retry, or a GET of that URL, answers 202
    until the flow finishes, then the stored response. Needs a completer (B2)."""
    in_progress_retry_after: int = 1
    """Retry-After (seconds) on a 409 for a key in progress (P4), and on a 202."""
    unavailable_retry_after: int = 5
    """Retry-After (seconds) on a 503 for an unreachable store (P11)."""
    stored_headers: frozenset[str] = field(init=False, repr=False)
    """The headers stored for replay: DEFAULT_REPLAY_HEADERS + replay_headers."""
    engine: Flow | None = field(init=False, repr=False, compare=False)
    """The engine run of a handler or transaction endpoint, built once from this
    policy (F6): a one-step flow whose step is the application handler, and ``run``
    its run of a request (`Flow.handler_engine`). None for a flow endpoint."""
    run: _Run | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        owner = "Policy"
        set_ = object.__setattr__
        set_(self, "methods", _methods(owner, self.methods))
        if isinstance(self.exclude_fields, str):
            raise _invalid(owner, "exclude_fields", self.exclude_fields, "must be a tuple of names")
        set_(self, "exclude_fields", tuple(self.exclude_fields))
        if self.key_field == "" or not isinstance(self.key_field, str | None):
            raise _invalid(owner, "key_field", self.key_field, "must be a form field name, or None")
        if self.scope is not None and not callable(self.scope):
            raise _invalid(owner, "scope", self.scope, "must be a callable: request -> tenant id")
        set_(self, "key_scope", _key_scope(owner, self.key_scope))
        if self.lock_timeout <= timedelta(0):
            raise _invalid(owner, "lock_timeout", self.lock_timeout, "must be positive")
        self._check_heartbeat(owner)
        if self.retention is not None and self.retention <= timedelta(0):
            raise _invalid(owner, "retention", self.retention, "must be positive, or None")
        for name in ("max_body_bytes", "max_response_bytes"):
            if getattr(self, name) < 0:
                raise _invalid(owner, name, getattr(self, name), "must be >= 0")
        rejected = frozenset(self.rejected_statuses)
        wrong = sorted(status for status in rejected if not 400 <= status <= 499)
        if wrong:
            raise _invalid(
                owner,
                "rejected_statuses",
                wrong,
                "must all be 4xx (5xx follow store_server_errors; 2xx and 3xx are stored)",
            )
        set_(self, "rejected_statuses", rejected)
        if isinstance(self.replay_headers, str):
            raise _invalid(owner, "replay_headers", self.replay_headers, "must be a tuple")
        extra = tuple(name.lower() for name in self.replay_headers)
        bad = sorted(set(extra) & _NEVER_STORED)
        if bad:
            raise _invalid(owner, "replay_headers", bad, "describe a transfer: never stored")
        set_(self, "replay_headers", extra)
        set_(self, "stored_headers", frozenset(DEFAULT_REPLAY_HEADERS) | frozenset(extra))
        if self.wait is not None and not timedelta(0) < self.wait <= timedelta(minutes=5):
            raise _invalid(owner, "wait", self.wait, "must be positive and at most 5 minutes")
        if self.transaction and self.flow is not None:
            raise _invalid(
                owner,
                "flow",
                self.flow,
                "cannot be combined with transaction=True: give the flow "
                "request_as_transaction=True instead",
            )
        if self.fail_open and self.mode is not Mode.HANDLER:
            raise _invalid(
                owner,
                "fail_open",
                True,
                f"needs a plain handler: in {self.mode.value} mode the store is the "
                "handler's transaction or its flow, and cannot be skipped",
            )
        if self.flow is not None:
            # The completer resumes a flow's keys by the flow's own settings (B2), so
            # they must be the flow's, not the endpoint's: never silently ignored.
            for name, default in (
                ("lock_timeout", DEFAULT_HANDLER_LOCK_TIMEOUT),
                ("retention", DEFAULT_RETENTION),
                ("store_server_errors", False),
            ):
                if getattr(self, name) != default:
                    raise _invalid(
                        owner,
                        name,
                        getattr(self, name),
                        f"does not apply to a flow endpoint: set Flow({name}=...) instead",
                    )
        if self.asynchronous:
            self._check_asynchronous(owner)
        if self.flow_params is not None and self.flow is None:
            raise _invalid(owner, "flow_params", self.flow_params, "needs a flow")
        for name in ("in_progress_retry_after", "unavailable_retry_after"):
            if getattr(self, name) < 1:
                raise _invalid(owner, name, getattr(self, name), "must be >= 1 second")
        set_(self, "engine", None if self.flow is not None else self._engine())

    def _check_heartbeat(self, owner: str) -> None:
        if self.heartbeat is None:
            return
        if not timedelta(0) < self.heartbeat < self.lock_timeout:
            raise _invalid(
                owner,
                "heartbeat",
                self.heartbeat,
                f"must be positive and shorter than lock_timeout={self.lock_timeout}",
            )
        if self.mode is not Mode.HANDLER:
            raise _invalid(
                owner,
                "heartbeat",
                self.heartbeat,
                f"needs a plain handler: in {self.mode.value} mode nothing beats "
                "(a flow's lock is its own; a transaction's claim is not committed)",
            )

    def _check_asynchronous(self, owner: str) -> None:
        # The status URL names the key only, and is read with the app's scope: it
        # cannot tell endpoints apart, nor know a per-endpoint tenant callable.
        why = None
        if self.flow is None:
            why = "needs a flow: the completer finishes what the background run does not"
        elif self.key_scope is not KeyScope.TENANT:
            why = "needs key_scope=KeyScope.TENANT: the status URL names the key only"
        elif self.scope is not None:
            why = "reads its status URL with Idempotency.scope: do not override scope"
        elif self.wait is not None:
            why = "answers 202 at once: it cannot wait"
        if why is not None:
            raise _invalid(owner, "asynchronous", True, why)

    def _engine(self) -> Flow:
        """The endpoint as a run of the one engine: a flow whose one step is the
        application handler, configured here and nowhere else (F6)."""
        engine = Flow(
            HTTP_FLOW,
            lock_timeout=self.lock_timeout,
            retention=self.retention,
            store_server_errors=self.store_server_errors,
            request_as_transaction=self.transaction,
        )
        engine.handler(
            limit=self.max_response_bytes,
            rejected_statuses=self.rejected_statuses,
            stored_headers=self.stored_headers,
            heartbeat=self.heartbeat,
        )
        object.__setattr__(self, "run", engine.handler_engine())
        return engine

    @property
    def mode(self) -> Mode:
        if self.flow is not None:
            return Mode.FLOW
        return Mode.TRANSACTION if self.transaction else Mode.HANDLER


_SEGMENT = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(:path)?\}")


def _compile(pattern: str) -> re.Pattern[str]:
    """``/v1/rides/{id}``: ``{name}`` matches one path segment, ``{name:path}`` the rest."""
    if not pattern.startswith("/"):
        raise ConfigurationError(f"Endpoint path {pattern!r} must start with '/'")
    regex, position = "", 0
    for match in _SEGMENT.finditer(pattern):
        regex += re.escape(pattern[position : match.start()])
        if match.group(2):
            if match.end() != len(pattern):
                raise ConfigurationError(f"{{{match.group(1)}:path}} must end pattern {pattern!r}")
            regex += f"(?P<{match.group(1)}>.*)"
        else:
            regex += f"(?P<{match.group(1)}>[^/]+)"
        position = match.end()
    return re.compile(regex + re.escape(pattern[position:]))


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A route pattern and its policy: ``"POST /v1/charges/{id}"`` or ``"/v1/orders"``
    (the policy's methods). ``policy=None`` leaves the endpoint unguarded.

    ```python
    Endpoint("POST,PATCH /v1/orders/{id}").match("PATCH", "/v1/orders/o_1")
    # {'id': 'o_1'}
    ```
    """

    route: str
    policy: Policy | None = field(default_factory=Policy)
    methods: frozenset[str] = field(init=False)
    path: str = field(init=False)
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        words = self.route.split()
        if len(words) == 2:
            given = [method for method in words[0].split(",") if method]
            methods = _methods(f"Endpoint({self.route!r})", given) if given else None
            path = words[1]
        elif len(words) == 1:
            methods, path = None, words[0]
        else:
            raise ConfigurationError(
                f"Endpoint route {self.route!r} must be 'METHOD /path' or '/path'"
            )
        if methods is None:
            # Unguarded without methods: every method of the path is left alone.
            methods = self.policy.methods if self.policy is not None else _ANY
        object.__setattr__(self, "methods", methods)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "_regex", _compile(path))

    def match(self, method: str, path: str) -> dict[str, str] | None:
        """The pattern's parameters if this endpoint serves ``method`` on ``path``."""
        if method not in self.methods and self.methods is not _ANY:
            return None
        found = self._regex.fullmatch(path)
        return None if found is None else found.groupdict()


_NO_SCOPE: Any = object()
_UNRESOLVED: Any = object()
_RESOLVED_MAX = 4096
"""How many (method, path) pairs Idempotency.resolve remembers; past it, it matches."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Idempotency:
    """Everything the middleware needs: the store, the tenant scope, the policies.

    ``scope`` is mandatory (a callable from
    [`RequestInfo`][idempotence.http.wsgi.RequestInfo] to a tenant id, or
    [`single_tenant`][idempotence.http.single_tenant]): keys are unique per tenant,
    never global by accident. ``endpoints`` are tried in order; the first that matches
    the method and path decides. A guarded method (``default.methods``) on any other
    path gets ``default``; ``default=None`` guards listed endpoints only.

    ``store`` is any key store ([`KeyStore`][idempotence.stores.redis.KeyStore], or its
    async twin for an ASGI app) for plain handler endpoints. An endpoint in
    ``transaction=True`` or ``flow=`` mode shares the store's transaction with the
    application, so it needs a SQL store
    ([`PostgresStore`][idempotence.stores.postgres.PostgresStore],
    [`SqliteStore`][idempotence.stores.sqlite.SqliteStore] or their async twins): with
    any other store it is refused here.
    """

    store: KeyStore | AsyncKeyStore
    scope: ScopeFn = _NO_SCOPE
    endpoints: tuple[Endpoint, ...] = ()
    default: Policy | None = field(default_factory=Policy)
    profile: Profile = Profile.IETF
    status_path: str = "/idempotence/operations"
    """Where the status of an asynchronous operation is read: ``GET
    <status_path>/<key>`` (percent-encoded), served by the middleware when an
    endpoint has ``Policy(asynchronous=True)``."""
    key_status_path: str | None = None
    """Where a key's status is read, when set (None, the default: nowhere). ``GET
    <key_status_path>/<key>`` (the key percent-encoded) answers 200 with the key's
    state as JSON, 404 for a key the tenant never sent or one already deleted, and 410
    once its retention has passed. The tenant is the scope callable's; a key sent to
    an endpoint whose policy has its own ``scope`` or ``key_scope=KeyScope.ENDPOINT``
    is named with its endpoint: ``?method=POST&path=/v1/orders``."""
    fingerprint_secret: str | bytes | None = field(default=None, repr=False)
    """Fingerprints are HMAC-SHA-256 keyed by this secret, not a plain SHA-256."""
    previous_fingerprint_secret: str | bytes | None = field(default=None, repr=False)
    """During a rotation, the secret replaced: keys stored under it still match."""
    secrets: tuple[bytes | None, bytes | None] = field(init=False, repr=False, compare=False)
    status_policy: Policy | None = field(init=False, repr=False, compare=False)
    """The asynchronous policy that serves status reads, and the flows it may show."""
    status_flows: frozenset[str] = field(init=False, repr=False, compare=False)
    key_status_policy: Policy | None = field(init=False, repr=False, compare=False)
    """The policy that [`resolve`][idempotence.http.Idempotency.resolve] gives a GET of
    a key's status URL (only that request gets this object), or None when the route
    is off."""
    _resolved: dict[tuple[str, str], Any] = field(init=False, repr=False, compare=False)
    """What [`resolve`][idempotence.http.Idempotency.resolve] found for a method and
    path, so that a path is matched against the patterns once (bounded: a path with
    parameters has many values)."""

    def __post_init__(self) -> None:
        if self.scope is _NO_SCOPE:
            raise ConfigurationError(
                "Idempotency(scope=...) is required: pass a callable that returns the "
                "request's tenant id (keys are unique per tenant), or "
                "scope=single_tenant() if the app has exactly one tenant"
            )
        if not callable(self.scope):
            raise _invalid("Idempotency", "scope", self.scope, "must be a callable")
        object.__setattr__(self, "endpoints", tuple(self.endpoints))
        for endpoint in self.endpoints:
            if not isinstance(endpoint, Endpoint):
                raise _invalid("Idempotency", "endpoints", endpoint, "must be Endpoint objects")
        object.__setattr__(self, "profile", Profile(self.profile))
        pair = secret_pair(self.fingerprint_secret, self.previous_fingerprint_secret, "Idempotency")
        object.__setattr__(self, "secrets", pair)
        for name in ("status_path", "key_status_path"):
            path = getattr(self, name)
            if path is not None and (not path.startswith("/") or path.endswith("/")):
                raise _invalid("Idempotency", name, path, "must start and not end with '/'")
        if self.key_status_path == self.status_path:
            raise _invalid(
                "Idempotency",
                "key_status_path",
                self.key_status_path,
                "is status_path too: give a key's status a path of its own",
            )
        key_status = None if self.key_status_path is None else Policy()
        object.__setattr__(self, "key_status_policy", key_status)
        policies = [e.policy for e in self.endpoints] + [self.default]
        accepting = [p for p in policies if p is not None and p.asynchronous]
        object.__setattr__(self, "status_policy", accepting[0] if accepting else None)
        flows = frozenset(p.flow.name for p in accepting if p.flow is not None)
        object.__setattr__(self, "status_flows", flows)
        object.__setattr__(self, "_resolved", {})
        if Capability.TRANSACTIONS not in capabilities_of(self.store):
            self._refuse_shared_transactions()

    def _refuse_shared_transactions(self) -> None:
        """A store without transactions shared with the application (not SQL) serves
        plain handler endpoints only: refuse the others now, not on their first request."""
        guarded = [(f"Endpoint({e.route!r})", e.policy) for e in self.endpoints]
        for owner, policy in [*guarded, ("Idempotency.default", self.default)]:
            if policy is not None and policy.mode is not Mode.HANDLER:
                raise ConfigurationError(
                    f"{owner} is in {policy.mode.value} mode, which "
                    f"{type(self.store).__name__} cannot serve. Request-as-transaction "
                    "and flows share the store's transaction with the application: they "
                    "need a SQL store (PostgresStore, SqliteStore, or their async twins); "
                    "this store serves plain handler endpoints only"
                )

    def resolve(self, method: str, path: str) -> tuple[Policy, Mapping[str, str]] | None:
        """The policy for ``method`` on ``path`` and the pattern's parameters, or None
        when the request passes through unguarded (P9). A GET of an operation's status
        URL resolves to the asynchronous policy, and one of a key's status URL to
        [`key_status_policy`][idempotence.http.Idempotency.key_status_policy], each
        with the key as parameter ``key``.

        ```python
        config.resolve("GET", "/v1/charges") is None
        # True
        ```
        """
        key_status = self.key_status_policy
        if key_status is not None and method == "GET":
            prefix = self.key_status_path
            assert prefix is not None
            # The prefix alone too (a key left out, or a trailing slash the framework
            # removed): an empty key, refused as such. Not remembered: every key is
            # another path.
            if path == prefix:
                return key_status, {"key": ""}
            if path.startswith(prefix) and path[len(prefix)] == "/":
                return key_status, {"key": path[len(prefix) + 1 :]}
        found = self._resolved.get((method, path), _UNRESOLVED)
        if found is _UNRESOLVED:
            found = self._resolve(method, path)
            if len(self._resolved) < _RESOLVED_MAX:
                self._resolved[method, path] = found
        if found is None:
            return None
        policy, params = found
        return policy, dict(params)  # the caller's own: RequestInfo.path_params

    def _resolve(self, method: str, path: str) -> tuple[Policy, Mapping[str, str]] | None:
        status = self.status_policy
        if status is not None and method == "GET" and path.startswith(self.status_path + "/"):
            key = path[len(self.status_path) + 1 :]
            return (status, {"key": key}) if key else None
        for endpoint in self.endpoints:
            params = endpoint.match(method, path)
            if params is not None:
                return None if endpoint.policy is None else (endpoint.policy, params)
        default = self.default
        if default is not None and method in default.methods:
            return default, {}
        return None

    def status_url(self, key: str) -> str:
        """Where the status of the asynchronous operation ``key`` is read.

        ```python
        Idempotency(store=store, scope=single_tenant()).status_url("a/b c")
        # '/idempotence/operations/a%2Fb%20c'
        ```
        """
        return f"{self.status_path}/{urllib.parse.quote(key, safe='')}"

    def key_status_url(self, key: str) -> str:
        """Where the status of ``key`` is read (``key_status_path`` must be set).

        ```python
        config = Idempotency(store=store, scope=single_tenant(), key_status_path="/keys")
        config.key_status_url("a/b")
        # '/keys/a%2Fb'
        ```
        """
        if self.key_status_path is None:
            raise ConfigurationError("key_status_url() needs Idempotency(key_status_path=...)")
        return f"{self.key_status_path}/{urllib.parse.quote(key, safe='')}"

    def scope_for(self, policy: Policy) -> ScopeFn:
        return policy.scope if policy.scope is not None else self.scope
