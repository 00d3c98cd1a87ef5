"""Hostile input through real servers: each gets the right status and problem body,
nothing is stored for it, and the server keeps serving.

Raw sockets, because no client library will send an empty, 10 000-character or
control-character key, or an unterminated quoted string.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.http import apps
from tests.http.clients import async_store, sync_store
from tests.http.servers import raw_request, uvicorn_server, waitress_server

BODY = b'{"amount": 100}'


@pytest.fixture(
    scope="module",
    params=["uvicorn-sqlite", "uvicorn-postgres", "waitress-sqlite", "waitress-postgres"],
)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Any]]:
    """A running server (one per module and kind: tests differ by tenant); yields its
    URL and a sync store on its database to inspect."""
    server, backend = request.param.split("-")
    if backend == "postgres":
        target = str(request.getfixturevalue("pg_http_url"))
    else:
        target = str(tmp_path_factory.mktemp("hostile") / "keys.sqlite3")
        with sync_store("sqlite", target) as store:
            store.migrate()
    effects = apps.Effects(backend)
    with sync_store(backend, target) as inspect, _serve(server, backend, target, effects) as url:
        yield url, inspect


@contextmanager
def _serve(server: str, backend: str, target: str, effects: apps.Effects) -> Iterator[str]:
    if server == "uvicorn":
        store = async_store(backend, target)

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            yield
            await store.close()

        with uvicorn_server(
            apps.starlette_app(effects, apps.make_config(store), lifespan=lifespan)
        ) as url:
            yield url
    else:
        with (
            sync_store(backend, target) as store,
            waitress_server(apps.flask_app(effects, apps.make_config(store))) as url,
        ):
            yield url


def post(
    url: str,
    tenant: str,
    *,
    key: bytes | None,
    body: bytes = BODY,
    path: str = "/charges",
    extra: bytes = b"",
    length: int | None = None,
) -> tuple[int, dict[str, str], bytes]:
    lines = [
        f"POST {path} HTTP/1.1".encode(),
        b"Host: 127.0.0.1",
        b"Connection: close",
        b"Content-Type: application/json",
        f"Content-Length: {len(body) if length is None else length}".encode(),
        f"{apps.TENANT_HEADER}: {tenant}".encode(),
    ]
    if key is not None:
        lines.append(b"Idempotency-Key: " + key)
    request = b"\r\n".join(lines) + b"\r\n" + extra + b"\r\n" + body
    return raw_request(url, request)


def problem_code(headers: dict[str, str], body: bytes) -> str | None:
    if headers.get("content-type") != "application/problem+json":
        return None
    return json.loads(body)["code"]


HOSTILE_KEYS = {
    "empty": b"",
    "256": b"k" * 256,
    "10000": b"k" * 10_000,
    "control": b"ab\x01cd",
    "nul": b"ab\x00cd",
    "non-ascii": "clé-ünïcode".encode(),
    "latin1-bytes": b"key\xff\xfe",
    "unterminated": b'"never-closed',
    "bad-escape": b'"a\\nb"',
}


@pytest.mark.parametrize("name", list(HOSTILE_KEYS))
def test_hostile_keys_are_400_store_nothing_and_the_server_keeps_serving(served, scope, name):
    url, inspect = served
    status, headers, body = post(url, scope, key=HOSTILE_KEYS[name])
    assert status == 400
    # The server's HTTP parser may refuse bytes HTTP forbids in a field (NUL, most
    # controls) before the app runs; whatever reaches the app gets our problem body.
    code = problem_code(headers, body)
    assert code in (None, "idempotency_key_invalid")
    if name in ("empty", "256", "10000", "unterminated", "bad-escape", "non-ascii", "latin1-bytes"):
        assert code == "idempotency_key_invalid", body  # these are valid HTTP: ours to refuse
        assert json.loads(body)["detail"]
    assert post(url, scope, key=b"after-" + name.encode())[0] == 201  # still serving
    assert inspect.get(scope, "after-" + name) is not None


def test_body_over_the_limit_is_413_before_it_is_read(served, scope):
    url, inspect = served
    big = b'{"pad": "' + b"x" * 5000 + b'"}'
    status, headers, body = post(url, scope, key=b"too-big", body=big)
    assert status == 413
    assert problem_code(headers, body) == "request_body_too_large"
    assert inspect.get(scope, "too-big") is None
    assert post(url, scope, key=b"after-big")[0] == 201


def test_chunked_body_over_the_limit_is_413(served, scope):
    url, inspect = served
    chunk = b"x" * 3000
    chunked = b"%x\r\n" % len(chunk) + chunk + b"\r\n0\r\n\r\n"
    request = (
        b"POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"
        + f"{apps.TENANT_HEADER}: {scope}\r\n".encode()
        + b"Idempotency-Key: chunked\r\n\r\n"
        + chunked
    )
    status, headers, body = raw_request(url, request)
    assert status == 413
    assert problem_code(headers, body) == "request_body_too_large"
    assert inspect.get(scope, "chunked") is None


def test_malformed_json_is_400_and_stores_nothing(served, scope):
    url, inspect = served
    status, headers, body = post(url, scope, key=b"bad-json", body=b'{"amount": 1,,}')
    assert status == 400
    assert problem_code(headers, body) == "request_body_invalid"
    assert "line 1" in json.loads(body)["detail"]  # says where
    assert inspect.get(scope, "bad-json") is None


def test_key_reused_on_another_path_is_422(served, scope):
    url, inspect = served
    assert post(url, scope, key=b"reused", path="/charges")[0] == 201
    status, headers, body = post(url, scope, key=b"reused", path="/refunds")
    assert status == 422
    assert problem_code(headers, body) == "idempotency_key_reused"
    assert inspect.get(scope, "reused").path == "/charges"  # the original stays


def test_two_key_headers_are_400(served, scope):
    url, inspect = served
    status, headers, body = post(url, scope, key=b"one", extra=b"Idempotency-Key: two\r\n")
    assert status == 400
    assert problem_code(headers, body) == "idempotency_key_repeated"
    assert inspect.get(scope, "one") is None and inspect.get(scope, "two") is None
