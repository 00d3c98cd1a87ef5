"""Flask: wrap the app's WSGI callable.

```python
from flask import Flask
from idempotence import PostgresStore
from idempotence.contrib.flask import install
from idempotence.http import Idempotency, header_scope
app = Flask(__name__)
install(app, Idempotency(store=PostgresStore(url),
                         scope=header_scope("x-account-id")))
```

``app.wsgi_app`` is what Flask's test client and every WSGI server call, so the
middleware guards both. It runs outside Flask's request context: the scope callable
reads the WSGI environ (``request.raw``), not ``flask.request``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..http._config import Idempotency
from ..http.wsgi import IdempotencyWSGIMiddleware

if TYPE_CHECKING:
    from flask import Flask

__all__ = ["install"]


def install(app: Flask, config: Idempotency) -> IdempotencyWSGIMiddleware:
    """Guard ``app`` with ``config`` (a sync store); returns the middleware."""
    middleware = IdempotencyWSGIMiddleware(app.wsgi_app, config)
    app.wsgi_app = middleware  # type: ignore[method-assign]
    return middleware
