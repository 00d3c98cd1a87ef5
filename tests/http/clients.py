"""Each framework's own test client behind one face, and the harness the suites use.

A :class:`Harness` is one app on one framework and one store (the async store for
ASGI, the sync store for WSGI), driven through that framework's test client, with a
sync store on the same database to look at the key table, and the app's
:class:`~tests.http.apps.Effects`.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from idempotence import ClaimRequest, KeyRecord, StoredResponse
from idempotence._backends import by_name
from idempotence.http import RequestInfo, request_fingerprint
from tests.http import apps

Header = tuple[str, str | bytes]


@dataclass
class Resp:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = self.all(name)
        return values[0] if values else None

    def all(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def problem(self) -> dict[str, Any]:
        """The problem body (IETF) or the Stripe error, whichever it is."""
        data = self.json()
        return data.get("error", data)


def _latin1(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


class HttpxClient:
    """Starlette's, FastAPI's and Litestar's test clients (httpx underneath)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def request(self, method: str, path: str, body: bytes, headers: Sequence[Header]) -> Resp:
        raw = [
            (k.encode("latin-1"), v if isinstance(v, bytes) else v.encode("latin-1"))
            for k, v in headers
        ]
        response = self.client.request(method, path, content=body, headers=raw)
        items = [(k.lower(), v) for k, v in response.headers.multi_items()]
        return Resp(response.status_code, items, response.content)


class FlaskClient:
    def __init__(self, client: Any) -> None:
        self.client = client

    def request(self, method: str, path: str, body: bytes, headers: Sequence[Header]) -> Resp:
        # Werkzeug folds repeated fields into one comma-separated value, as servers do.
        response = self.client.open(
            path, method=method, data=body, headers=[(k, _latin1(v)) for k, v in headers]
        )
        items = [(k.lower(), v) for k, v in response.headers.to_wsgi_list()]
        return Resp(response.status_code, items, response.get_data())


class DjangoClient:
    def __init__(self, client: Any) -> None:
        self.client = client

    def request(self, method: str, path: str, body: bytes, headers: Sequence[Header]) -> Resp:
        content_type = "application/octet-stream"
        extra: dict[str, str] = {}
        for name, value in headers:
            text = _latin1(value)
            if name.lower() == "content-type":
                content_type = text
                continue
            key = "HTTP_" + name.upper().replace("-", "_")
            # A WSGI server folds repeated fields into one value; so do we.
            extra[key] = f"{extra[key]}, {text}" if key in extra else text
        response = self.client.generic(method, path, data=body, content_type=content_type, **extra)
        items = [(k.lower(), v) for k, v in response.items()]
        items += [("set-cookie", morsel.OutputString()) for morsel in response.cookies.values()]
        data = b"".join(response.streaming_content) if response.streaming else response.content
        return Resp(response.status_code, items, data)


JSON_BODY: Any = {"amount": 100, "meta": {"sent_at": "2024-01-01T00:00:00Z"}}
_NO_BODY = object()


@dataclass
class Harness:
    framework: str
    backend: str
    client: Any
    effects: apps.Effects
    #: A sync store on the same database, to look at keys and to act as "a twin".
    inspect: Any
    tenant: str
    #: Closes the middleware's own store: it becomes unavailable (P11).
    break_store: Any
    config: Any
    extra: dict[str, Any] = field(default_factory=dict)

    def post(
        self,
        path: str = "/charges",
        body: Any = _NO_BODY,
        *,
        key: str | bytes | None = None,
        raw: bytes | None = None,
        content_type: str = "application/json",
        headers: Sequence[Header] = (),
        tenant: str | None = None,
        method: str = "POST",
    ) -> Resp:
        data = raw if raw is not None else self.body_bytes(body)
        sent: list[Header] = [("content-type", content_type)]
        tenant = self.tenant if tenant is None else tenant
        if tenant:
            sent.append((apps.TENANT_HEADER, tenant))
        if key is not None:
            sent.append(("idempotency-key", key))
        sent.extend(headers)
        return self.client.request(method, path, data, sent)

    def get(self, path: str = "/charges", **kwargs: Any) -> Resp:
        return self.post(path, raw=b"", method="GET", **kwargs)

    @staticmethod
    def body_bytes(body: Any = _NO_BODY) -> bytes:
        return json.dumps(JSON_BODY if body is _NO_BODY else body).encode()

    def record(self, key: str, tenant: str | None = None) -> KeyRecord | None:
        return self.inspect.get(tenant or self.tenant, key)

    def hold(
        self,
        key: str,
        path: str = "/charges",
        body: Any = _NO_BODY,
        *,
        lock_timeout: timedelta = timedelta(seconds=60),
    ) -> Any:
        """Claim ``key`` as a twin would for the same request: returns the claim."""
        data = self.body_bytes(body)
        info = RequestInfo("POST", path, headers=(("content-type", "application/json"),))
        policy, _ = self.config.resolve("POST", path)
        fingerprint = request_fingerprint(info, data, policy.exclude_fields)
        request = ClaimRequest(
            scope=self.tenant,
            key=key,
            fingerprint=fingerprint,
            method="POST",
            path=path,
            flow="http",
            lock_timeout=lock_timeout,
        )
        return self.inspect.claim(request)

    def finish_twin(self, lease: Any, body: bytes = b"from-twin") -> None:
        self.inspect.finish(lease, StoredResponse.of(201, {"content-type": "text/plain"}, body))

    def transfers(self, note_like: str = "%") -> int:
        """Rows the request-as-transaction endpoints wrote for this tenant."""
        with self.inspect.transaction() as tx:
            rows = tx.execute(
                "SELECT count(*) AS n FROM http_transfers WHERE scope = :s", {"s": self.tenant}
            )
        return int(rows[0]["n"])


def sync_store(backend: str, target: str) -> Any:
    """The sync store of ``backend`` (a name of the library's table of backends) on
    ``target``: a new backend needs nothing here."""
    sync, _ = by_name(backend).store_classes()
    return sync(target)


def async_store(backend: str, target: str) -> Any:
    _, async_ = by_name(backend).store_classes()
    return async_(target)


@contextmanager
def open_harness(
    framework: str, backend: str, target: str, tenant: str, **overrides: Any
) -> Iterator[Harness]:
    """The app on ``framework`` over the ``backend`` database at ``target``."""
    effects = apps.Effects(backend)
    apps.FLOW_EFFECTS.append(effects)
    asgi = framework in apps.ASGI
    store_factory = overrides.pop("store_factory", None)
    store = (
        store_factory() if store_factory else (async_store if asgi else sync_store)(backend, target)
    )
    config = apps.make_config(store, **overrides)
    with ExitStack() as stack:
        inspect = sync_store(backend, target)
        stack.callback(inspect.close)
        if asgi:
            client, portal = _asgi_client(stack, framework, effects, config)
            stack.callback(lambda: _close_async(portal, store))

            def breaker() -> None:
                # Use it once first: an async PostgreSQL pool opens on first use, and
                # closing one that never opened would not stop it from opening later.
                portal().call(store.get, "-", "-")
                portal().call(store.close)

        else:
            client = _wsgi_client(stack, framework, effects, config)
            stack.callback(store.close)
            breaker = store.close
        yield Harness(framework, backend, client, effects, inspect, tenant, breaker, config)


def _close_async(portal: Any, store: Any) -> None:
    with suppress(Exception):
        portal().call(store.close)


def _asgi_client(stack: ExitStack, framework: str, effects: apps.Effects, config: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Starlette's notice about httpx vs httpx2
        from starlette.testclient import TestClient
    if framework == "litestar":
        from litestar.testing import TestClient as LitestarClient

        raw = stack.enter_context(
            LitestarClient(apps.litestar_app(effects, config), raise_server_exceptions=False)
        )
        return HttpxClient(raw), lambda: raw.blocking_portal
    build = apps.starlette_app if framework == "starlette" else apps.fastapi_app
    raw = stack.enter_context(TestClient(build(effects, config), raise_server_exceptions=False))
    return HttpxClient(raw), lambda: raw.portal


def _wsgi_client(stack: ExitStack, framework: str, effects: apps.Effects, config: Any) -> Any:
    if framework == "flask":
        return FlaskClient(apps.flask_app(effects, config).test_client())
    from django.test import Client, override_settings

    from tests.http import django_app  # noqa: F401 - configures Django

    apps.DJANGO_EFFECTS.append(effects)
    stack.enter_context(override_settings(IDEMPOTENCE=config))
    return DjangoClient(Client(raise_request_exception=False))
