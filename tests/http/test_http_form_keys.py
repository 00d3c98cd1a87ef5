"""The key from a form field (``Policy(key_field=...)``), for HTML forms, which cannot
send headers: on Starlette (ASGI) and Flask (WSGI), with form-encoded and
multipart bodies, through each framework's own test client and a real SQLite store.

Each guarantee was checked to fail without its code: without the field read, a
double submit answers 400 (no key); without the field's exclusion from the fingerprint,
the header-wins test answers 422; without the multipart canonical form, a second
multipart submit (a new boundary) answers 422."""

from __future__ import annotations

import itertools
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from idempotence import open_async_store, open_store
from idempotence._multipart import parse_multipart
from idempotence.errors import ConfigurationError
from idempotence.http import Endpoint, Idempotency, Policy, header_scope

FIELD = "idempotency_key"
TENANT = {"x-account-id": "acct_1"}
_keys = itertools.count()


@dataclass
class Answer:
    status: int
    json: Any
    headers: dict[str, str]


@dataclass
class App:
    orders: list[dict[str, str]]
    post: Callable[..., Answer]  # (data, *, headers=None, files=None) -> Answer


def _policy() -> Policy:
    return Policy(key_field=FIELD)


def _starlette(path: str) -> Iterator[App]:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from idempotence.http import IdempotencyMiddleware

    store = open_async_store(f"sqlite:///{path}")
    orders: list[dict[str, str]] = []

    async def create_order(request: Request) -> JSONResponse:
        # Read by hand: Starlette's request.form() needs python-multipart, not installed.
        body, content_type = await request.body(), request.headers["content-type"]
        if content_type.startswith("multipart/"):
            pairs = [(p.name, p.data.decode()) for p in parse_multipart(body, content_type)]
        else:
            pairs = urllib.parse.parse_qsl(body.decode(), keep_blank_values=True)
        order = {name: value for name, value in pairs if name != FIELD}
        orders.append(order)
        return JSONResponse({"order": len(orders), **order}, status_code=201)

    config = Idempotency(
        store=store,
        scope=header_scope("x-account-id"),
        endpoints=[Endpoint("POST /orders", _policy())],
    )
    app = Starlette(routes=[Route("/orders", create_order, methods=["POST"])])
    with TestClient(IdempotencyMiddleware(app, config=config)) as client:
        client.portal.call(store.migrate)  # type: ignore[union-attr]

        def post(data: Any, *, headers: dict[str, str] | None = None, files: Any = None) -> Answer:
            sent = {**TENANT, **(headers or {})}
            if isinstance(data, bytes):  # sent as is, under the Content-Type in headers
                reply = client.post("/orders", content=data, headers=sent)
            else:
                reply = client.post("/orders", data=data, files=files, headers=sent)
            return Answer(reply.status_code, reply.json(), dict(reply.headers))

        yield App(orders, post)
        client.portal.call(store.close)  # type: ignore[union-attr]


def _flask(path: str) -> Iterator[App]:
    from flask import Flask, request

    from idempotence.contrib.flask import install

    store = open_store(f"sqlite:///{path}")
    store.migrate()
    orders: list[dict[str, str]] = []
    app = Flask(__name__)
    install(
        app,
        Idempotency(
            store=store,
            scope=header_scope("x-account-id"),
            endpoints=[Endpoint("POST /orders", _policy())],
        ),
    )

    @app.post("/orders")
    def create_order() -> tuple[dict[str, Any], int]:
        order = {name: value for name, value in request.form.items() if name != FIELD}
        order.update({name: file.read().decode() for name, file in request.files.items()})
        orders.append(order)
        return {"order": len(orders), **order}, 201

    client = app.test_client()

    def post(data: Any, *, headers: dict[str, str] | None = None, files: Any = None) -> Answer:
        if isinstance(data, bytes):  # sent as is, under the Content-Type in headers
            sent = {**TENANT, **(headers or {})}
            reply = client.post("/orders", data=data, headers=sent)
            return Answer(reply.status_code, reply.get_json(), dict(reply.headers))
        payload: dict[str, Any] = dict(data)
        content_type = None
        if files is not None:
            import io

            for name, (filename, content) in files.items():
                payload[name] = (io.BytesIO(content), filename)
            content_type = "multipart/form-data"
        reply = client.post(
            "/orders",
            data=payload,
            headers={**TENANT, **(headers or {})},
            content_type=content_type,
        )
        return Answer(reply.status_code, reply.get_json(), dict(reply.headers))

    yield App(orders, post)
    store.close()


@pytest.fixture(params=["starlette", "flask"])
def app(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[App]:
    make = _starlette if request.param == "starlette" else _flask
    yield from make(str(tmp_path / "keys.sqlite3"))


def _key() -> str:
    return f"form-{next(_keys)}"


def test_a_double_submitted_form_creates_one_order(app: App) -> None:
    form = {"item": "tea", "quantity": "2", FIELD: _key()}
    first, second = app.post(form), app.post(form)
    assert (first.status, second.status) == (201, 201)
    assert second.json == first.json and second.headers.get("idempotent-replayed") == "true"
    assert app.orders == [{"item": "tea", "quantity": "2"}]


def test_a_double_submitted_multipart_form_creates_one_order(app: App) -> None:
    # Each submit has a new random boundary: the fingerprint reads the parts.
    form = {"item": "tea", FIELD: _key()}
    files = {"note": ("note.txt", b"ring twice")}
    first, second = app.post(form, files=files), app.post(form, files=files)
    assert (first.status, second.status) == (201, 201)
    assert second.headers.get("idempotent-replayed") == "true"
    assert len(app.orders) == 1
    other = app.post(form, files={"note": ("note.txt", b"ring once")})
    assert other.status == 422 and other.json["code"] == "idempotency_key_reused"


def test_the_header_wins_over_the_field(app: App) -> None:
    header = _key()
    first = app.post({"item": "tea", FIELD: _key()}, headers={"idempotency-key": header})
    # The same header with another field value is the same request: the field is
    # neither the key nor part of the fingerprint.
    second = app.post({"item": "tea", FIELD: _key()}, headers={"idempotency-key": header})
    assert (first.status, second.status) == (201, 201)
    assert second.headers.get("idempotent-replayed") == "true"
    # And the header's key is the one stored: the field alone is a new request.
    alone = app.post({"item": "tea", FIELD: header})
    assert alone.headers.get("idempotent-replayed") == "true"
    assert len(app.orders) == 1


def test_the_field_is_excluded_but_the_rest_of_the_form_counts(app: App) -> None:
    key = _key()
    assert app.post({"item": "tea", FIELD: key}).status == 201
    other = app.post({"item": "coffee", FIELD: key})
    assert other.status == 422 and other.json["code"] == "idempotency_key_reused"
    assert len(app.orders) == 1


@pytest.mark.parametrize(
    ("form", "code"),
    [
        ({"item": "tea", FIELD: ""}, "idempotency_key_invalid"),
        ({"item": "tea", FIELD: "caf\u00e9"}, "idempotency_key_invalid"),
        ({"item": "tea", FIELD: "k" * 256}, "idempotency_key_invalid"),
        ({"item": "tea"}, "idempotency_key_missing"),
    ],
)
def test_a_malformed_or_missing_field_is_400_with_a_problem(
    app: App, form: dict[str, str], code: str
) -> None:
    answer = app.post(form)
    assert answer.status == 400
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json["code"] == code and FIELD in answer.json["detail"]
    assert app.orders == []


def test_key_field_is_checked_when_built() -> None:
    with pytest.raises(ConfigurationError, match="key_field"):
        Policy(key_field="")


def test_a_multipart_body_that_does_not_parse_is_400(app: App) -> None:
    cut_short = b'--zzz\r\nContent-Disposition: form-data; name="item"\r\n\r\ntea'
    answer = app.post(
        cut_short,
        headers={"idempotency-key": _key(), "content-type": "multipart/form-data; boundary=zzz"},
    )
    assert answer.status == 400
    assert answer.json["code"] == "request_body_invalid"
    assert "closing boundary" in answer.json["detail"]
    assert app.orders == []
