"""Litestar: the ASGI middleware, as Litestar declares middleware.

```python
from litestar import Litestar
from idempotence import AsyncPostgresStore
from idempotence.contrib.litestar import idempotency_middleware
from idempotence.http import Idempotency, header_scope
app = Litestar(
    route_handlers=[...],
    middleware=[idempotency_middleware(Idempotency(
        store=AsyncPostgresStore(url), scope=header_scope("x-account-id")))],
)
```

Litestar runs app-level middleware after routing, inside its exception handling: an
exception in a handler reaches the middleware as Litestar's 500 response, which
releases the key unstored like any 5xx (R5). A path without a route never reaches
the middleware, so the URLs it answers itself (a key's status, an asynchronous
operation's status) need routes: [`status_routes`][idempotence.contrib.litestar.status_routes]
gives them.
"""

from __future__ import annotations

from typing import Any, cast

from litestar import get
from litestar.exceptions import NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.middleware import DefineMiddleware

from ..http._config import Idempotency
from ..http.asgi import IdempotencyMiddleware

__all__ = ["idempotency_middleware", "status_routes"]


def idempotency_middleware(config: Idempotency) -> DefineMiddleware:
    """The middleware for ``Litestar(middleware=[...])``, with an async store."""
    # Litestar's ASGI types are TypedDicts; the middleware takes any mapping.
    return DefineMiddleware(cast(Any, IdempotencyMiddleware), config=config)


def status_routes(config: Idempotency) -> list[HTTPRouteHandler]:
    """Routes for the GET URLs the middleware answers itself: a key's status
    (``Idempotency(key_status_path=...)``) and an asynchronous operation's
    (``status_path``, when an endpoint accepts asynchronously). Litestar routes a request
    before its middleware runs, so without a route such a GET would be Litestar's 404;
    with one, the middleware answers it and the route's own handler never runs.

    ```python
    config = Idempotency(store=store, scope=header_scope("x-account-id"),
                         key_status_path="/idempotence/keys")
    app = Litestar(route_handlers=[create_payment, *status_routes(config)],
                   middleware=[idempotency_middleware(config)])
    ```
    """
    paths = [] if config.key_status_path is None else [config.key_status_path]
    if config.status_policy is not None:
        paths.append(config.status_path)
    return [_answered_by_the_middleware(path) for path in paths]


def _answered_by_the_middleware(prefix: str) -> HTTPRouteHandler:
    async def handler() -> None:
        # Reached only when the idempotency middleware is not installed on this app.
        raise NotFoundException(f"{prefix} is answered by the idempotency middleware")

    return get(f"{prefix}/{{key:path}}", include_in_schema=False, name=f"idempotence:{prefix}")(
        handler
    )
