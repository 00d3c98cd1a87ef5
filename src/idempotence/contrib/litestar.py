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
releases the key unstored like any 5xx (R5).
"""

from __future__ import annotations

from typing import Any, cast

from litestar.middleware import DefineMiddleware

from ..http._config import Idempotency
from ..http.asgi import IdempotencyMiddleware

__all__ = ["idempotency_middleware"]


def idempotency_middleware(config: Idempotency) -> DefineMiddleware:
    """The middleware for ``Litestar(middleware=[...])``, with an async store."""
    # Litestar's ASGI types are TypedDicts; the middleware takes any mapping.
    return DefineMiddleware(cast(Any, IdempotencyMiddleware), config=config)
