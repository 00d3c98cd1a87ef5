"""Django: a middleware configured by ``settings.IDEMPOTENCE``.

With `DjangoStore` (the store on Django's own
connection) and ``Policy(transaction=True)``, a guarded view runs inside
``transaction.atomic()`` with the key's claim: its ORM writes, the claim and the
stored response commit together, or, if the view raises or answers an error that is
not stored, all roll back (F3). The guide "Guard Django views"
(docs/how-to/django.md) shows a whole app.

```python
# settings.py
def account(request: RequestInfo) -> str | None:
    user = request.raw.user                   # the HttpRequest's user
    return str(user.pk) if user.is_authenticated else None
IDEMPOTENCE = Idempotency(store=PostgresStore(os.environ["DATABASE_URL"]), scope=account)
MIDDLEWARE = [
    ...,
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "idempotence.contrib.django.IdempotencyMiddleware",   # after authentication
]
```

The middleware is sync only (``async_capable = False``): Django runs it in a thread
under ASGI, and an async view's ORM calls would not run on its connection.

The scope callable gets a [`RequestInfo`][idempotence.http.wsgi.RequestInfo] whose
``raw`` is the ``HttpRequest``, so it can use ``request.user``. Django runs it sync with
a sync store (``PostgresStore``, ``SqliteStore``, or another ``KeyStore`` for plain
handler endpoints). Wrapping the WSGI application in
[`IdempotencyWSGIMiddleware`][idempotence.http.wsgi.IdempotencyWSGIMiddleware] works
too, without the tenant from ``request.user``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator

# Django ships without type information (django-stubs is not a dependency).
from django.conf import settings  # type: ignore[import-untyped]
from django.http import (  # type: ignore[import-untyped]
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    StreamingHttpResponse,
)

from ..errors import BodyTooLarge, ConfigurationError
from ..flows.effects import DoHandle
from ..http._config import Idempotency
from ..http._context import bound
from ..http._core import lifecycle
from ..http._driver import drive
from ..http._effects import Capture, Captured, Reply, ReplyKind
from ..http._request import RequestInfo
from ..http.wsgi import environ_headers
from ..stores import KeyStore, Transaction
from ..stores.keyvalue import is_sync
from .django_app.store import DjangoStore

__all__ = ["IdempotencyMiddleware"]

GetResponse = Callable[[HttpRequest], HttpResponseBase]


class IdempotencyMiddleware:
    """Make POST and PATCH (by default) exactly-once per ``Idempotency-Key``."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: GetResponse) -> None:
        config = getattr(settings, "IDEMPOTENCE", None)
        if not isinstance(config, Idempotency):
            raise ConfigurationError(
                "settings.IDEMPOTENCE must be an idempotence.http.Idempotency, "
                f"not {type(config).__name__}"
            )
        store = config.store
        if not is_sync(store):
            raise ConfigurationError(
                "the Django middleware needs a sync store: PostgresStore, SqliteStore or "
                f"another KeyStore, not {type(store).__name__}"
            )
        if isinstance(store, DjangoStore):
            store.check()  # a backend it cannot run on fails here, at startup
        self.get_response = get_response
        self.config = config
        self.store: KeyStore = store

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        method = request.method or "GET"
        found = self.config.resolve(method, request.path_info)
        if found is None:
            return self.get_response(request)  # P9
        policy, params = found
        info = RequestInfo(
            method=method,
            path=request.path_info,
            query=request.META.get("QUERY_STRING", ""),
            headers=environ_headers(request.META),
            raw=request,
            path_params=params,
        )
        exchange = _Exchange(self.get_response, request)
        return exchange.reply(
            drive(lifecycle(self.config, policy, info, exchange), self.store, exchange)
        )

    def process_exception(self, request: HttpRequest, exception: Exception) -> None:
        """Note the view's exception: Django answers it with a 500 of its own before
        the response reaches us, and in a request's transaction it must roll back
        (the exception is raised again once it has, see ``_Exchange.run_app``)."""
        request._idempotence_exception = exception


class _Exchange:
    """One request's state: the app's response as it comes."""

    def __init__(self, get_response: GetResponse, request: HttpRequest) -> None:
        self.get_response = get_response
        self.request = request
        self.response: HttpResponseBase | None = None

    def read_body(self, limit: int) -> bytes:
        length = str(self.request.META.get("CONTENT_LENGTH") or "").strip()
        if length.isdigit() and int(length) > limit:
            raise BodyTooLarge()
        body: bytes = self.request.body  # Django caches it for the view
        if len(body) > limit:
            raise BodyTooLarge()
        return body

    def run_app(
        self, run: DoHandle, tx: Transaction | None, overflow: Callable[[int], None] | None
    ) -> Captured:
        """Run the app for the engine ([`DoHandle`][idempotence.http.wsgi.DoHandle]),
        with ``tx`` and the lease bound for the handler."""
        with bound(tx, run.lease):
            captured = self._run_app(run, overflow)
        raised = getattr(self.request, "_idempotence_exception", None)
        if tx is not None and raised is not None:
            # The view raised in the request's transaction: everything rolls back with
            # the claim, and the exception goes on to Django (its 500, its logging).
            raise raised
        return captured

    def _run_app(self, run: DoHandle, overflow: Callable[[int], None] | None) -> Captured:
        response = self.get_response(self.request)
        self.response = response
        capture = Capture(run.limit)
        capture.start(response.status_code, _headers(response))
        if isinstance(response, StreamingHttpResponse):
            chunks: Iterator[bytes] = iter(response)
            for chunk in chunks:
                if capture.add(chunk) and overflow is not None:
                    overflow(response.status_code)
                    response.streaming_content = itertools.chain([capture.buffered()], chunks)
                    return capture.result()
            response.streaming_content = [capture.buffered()]
        elif isinstance(response, HttpResponse):
            if capture.add(response.content) and overflow is not None:
                overflow(response.status_code)  # the original goes out as it is
        else:
            raise ConfigurationError(f"cannot buffer a {type(response).__name__}")
        return capture.result()

    def reply(self, reply: Reply) -> HttpResponseBase:
        if reply.kind is ReplyKind.PASS:
            return self.get_response(self.request)
        if reply.kind is ReplyKind.SENT or (reply.original and self.response is not None):
            assert self.response is not None
            return self.response  # with its cookies and everything else Django adds
        stored = reply.response
        assert stored is not None
        response = HttpResponse(stored.body, status=stored.status)
        _set_headers(response, stored.headers)
        return response


def _headers(response: HttpResponseBase) -> Iterable[tuple[str, str]]:
    # Django keeps cookies apart from the headers and adds them at the last moment.
    yield from response.items()
    for morsel in response.cookies.values():
        yield "set-cookie", morsel.OutputString()


def _set_headers(response: HttpResponse, headers: Iterable[tuple[str, str]]) -> None:
    for name, value in headers:
        if name.lower() == "set-cookie":
            response.cookies.load(value)
        else:
            response.headers[name] = value
