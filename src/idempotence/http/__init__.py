"""HTTP integration: make POST and PATCH exactly-once per ``Idempotency-Key``.

One sans-I/O core (`_core`) and thin drivers:
[`IdempotencyMiddleware`][idempotence.http.asgi.IdempotencyMiddleware] (pure ASGI:
Starlette, FastAPI, Litestar) and
[`IdempotencyWSGIMiddleware`][idempotence.http.wsgi.IdempotencyWSGIMiddleware] (Flask,
any WSGI app); Django has `idempotence.contrib.django`.

```python
from idempotence import AsyncSqliteStore
from idempotence.http import Endpoint, Idempotency, IdempotencyMiddleware, Policy
config = Idempotency(
    store=AsyncSqliteStore("keys.sqlite3"),
    scope=lambda request: request.header("x-account-id"),
    endpoints=[Endpoint("POST /v1/transfers", Policy(transaction=True))],
)
app = IdempotencyMiddleware(app, config)
```

Every setting is in the guide "Tune an endpoint's policy" (docs/how-to/endpoint-policy.md).
"""

from __future__ import annotations

from ._config import (
    DEFAULT_METHODS,
    DEFAULT_REJECTED_STATUSES,
    DEFAULT_REPLAY_HEADERS,
    Endpoint,
    Idempotency,
    KeyScope,
    Mode,
    Policy,
    ScopeFn,
    header_scope,
    single_tenant,
)
from ._context import current_async_transaction, current_lease, current_transaction
from ._problems import Problem, Profile
from ._request import RequestInfo, request_fingerprint
from .asgi import IdempotencyMiddleware
from .wsgi import IdempotencyWSGIMiddleware

__all__ = [
    "DEFAULT_METHODS",
    "DEFAULT_REJECTED_STATUSES",
    "DEFAULT_REPLAY_HEADERS",
    "Endpoint",
    "Idempotency",
    "IdempotencyMiddleware",
    "IdempotencyWSGIMiddleware",
    "KeyScope",
    "Mode",
    "Policy",
    "Problem",
    "Profile",
    "RequestInfo",
    "ScopeFn",
    "current_async_transaction",
    "current_lease",
    "current_transaction",
    "header_scope",
    "request_fingerprint",
    "single_tenant",
]
