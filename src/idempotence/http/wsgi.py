"""The idempotency middleware for WSGI apps (Flask, Django's WSGI app, ...).

Unguarded requests go straight to the app. For a guarded one the body is read from
``wsgi.input`` (and handed to the app again in a fresh stream) and the app's
response is collected from ``start_response`` and its iterable before anything is
sent. Per-request state lives in the `_Exchange` each call makes.

```python
from idempotence import PostgresStore
from idempotence.http import Idempotency, header_scope
from idempotence.http.wsgi import IdempotencyWSGIMiddleware
app.wsgi_app = IdempotencyWSGIMiddleware(
    app.wsgi_app,
    Idempotency(store=PostgresStore("postgresql://app@db/app"),
                scope=header_scope("x-account-id")),
)
```

It needs a sync store ([`PostgresStore`][idempotence.stores.postgres.PostgresStore],
[`SqliteStore`][idempotence.stores.sqlite.SqliteStore], or another
[`KeyStore`][idempotence.stores.redis.KeyStore] for plain handler endpoints).
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any

from ..errors import BodyTooLarge, ConfigurationError
from ..flows.effects import DoHandle
from ..stores import KeyStore, Transaction
from ..stores.keyvalue import is_sync
from ._config import Idempotency
from ._context import bound
from ._core import lifecycle
from ._driver import drive
from ._effects import Capture, Captured, Reply, ReplyKind
from ._request import RequestInfo

__all__ = ["IdempotencyWSGIMiddleware", "environ_headers", "status_line"]

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], Any]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

_CHUNK = 64 * 1024


class IdempotencyWSGIMiddleware:
    """Make POST and PATCH (by default) exactly-once per ``Idempotency-Key``."""

    def __init__(self, app: WSGIApp, config: Idempotency) -> None:
        store = config.store
        if not is_sync(store):
            raise ConfigurationError(
                "the WSGI middleware needs a sync store: PostgresStore, SqliteStore or "
                f"another KeyStore, not {type(store).__name__}"
            )
        self.app = app
        self.config = config
        self.store: KeyStore = store

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        path = wsgi_path(environ)
        found = self.config.resolve(method, path)
        if found is None:
            return self.app(environ, start_response)  # P9
        policy, params = found
        request = RequestInfo(
            method=method,
            path=path,
            query=environ.get("QUERY_STRING", ""),
            headers=environ_headers(environ),
            raw=environ,
            path_params=params,
        )
        exchange = _Exchange(self.app, environ, start_response)
        reply = drive(lifecycle(self.config, policy, request, exchange), self.store, exchange)
        return exchange.reply(reply)


def wsgi_path(environ: Environ) -> str:
    # PEP 3333 hands the path as latin-1 code points of its bytes; read them as UTF-8,
    # as ASGI servers do, so patterns and fingerprints agree between the two.
    raw: str = environ.get("PATH_INFO", "") or "/"
    return raw.encode("latin-1").decode("utf-8", "replace")


def environ_headers(environ: Environ) -> tuple[tuple[str, str], ...]:
    """The request headers of a WSGI environ, as lower-cased ``(name, value)`` pairs.

    A server combines repeated fields into one comma-separated value.
    """
    headers = []
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            headers.append((name[5:].replace("_", "-").lower(), value))
        elif name in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            headers.append((name.replace("_", "-").lower(), value))
    return tuple(headers)


def status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


class _Exchange:
    """One request's state: its body, the app's response as it comes."""

    def __init__(self, app: WSGIApp, environ: Environ, start_response: StartResponse) -> None:
        self.app = app
        self.environ = environ
        self.start_response = start_response
        self.body: bytes | None = None
        self.status: str | None = None
        #: The rest of a too-large response, streamed after what was buffered.
        self.stream: Iterable[bytes] | None = None

    def read_body(self, limit: int) -> bytes:
        stream = self.environ["wsgi.input"]
        length = self.environ.get("CONTENT_LENGTH", "").strip()
        if length.isdigit():
            wanted = int(length)
            if wanted > limit:
                raise BodyTooLarge()
            chunks, left = [], wanted
            while left > 0:
                chunk = stream.read(min(left, _CHUNK))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            self.body = b"".join(chunks)
        elif self.environ.get("wsgi.input_terminated"):
            # Chunked upload: read to the end, but never more than one byte past the limit.
            self.body = stream.read(limit + 1)
            if len(self.body) > limit:
                raise BodyTooLarge()
        else:
            self.body = b""  # PEP 3333: no Content-Length, no body
        return self.body

    def environ_with_body(self) -> Environ:
        environ = dict(self.environ)
        body = self.body or b""
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return environ

    def run_app(
        self, run: DoHandle, tx: Transaction | None, overflow: Callable[[int], None] | None
    ) -> Captured:
        """Run the app for the engine ([`DoHandle`][idempotence.http.wsgi.DoHandle]),
        with ``tx`` and the lease bound for the handler."""
        with bound(tx, run.lease):
            return self._run_app(run, overflow)

    def _run_app(self, run: DoHandle, overflow: Callable[[int], None] | None) -> Captured:
        capture = Capture(run.limit)
        write_to: list[Callable[[bytes], Any]] = []  # the server's write(), once streaming

        def write(data: bytes) -> None:  # PEP 3333's legacy write()
            if write_to:
                write_to[0](data)
            elif capture.add(data) and overflow is not None:
                write_to.append(self._start_streaming(capture, overflow))

        def start_response(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], Any]:
            if exc_info is not None and write_to:
                raise exc_info[1].with_traceback(exc_info[2])  # too late to change
            self.status = status
            capture.start(int(status.split(" ", 1)[0]), headers)
            return write

        result = self.app(self.environ_with_body(), start_response)
        iterator = iter(result)
        try:
            for chunk in iterator:
                if write_to:
                    write_to[0](chunk)
                elif capture.add(chunk) and overflow is not None:
                    # Too large to store: settle the key, then hand the server what we
                    # buffered followed by the rest of the app's iterable.
                    assert capture.status is not None
                    assert self.status is not None
                    overflow(capture.status)
                    self.start_response(self.status, list(capture.headers))
                    self.stream = _Rest(itertools.chain([capture.buffered()], iterator), result)
                    return capture.result()
        except BaseException:
            _close(result)
            raise
        _close(result)
        return capture.result()

    def _start_streaming(
        self, capture: Capture, overflow: Callable[[int], None]
    ) -> Callable[[bytes], Any]:
        assert capture.status is not None
        assert self.status is not None
        overflow(capture.status)
        server_write = self.start_response(self.status, list(capture.headers))
        server_write(capture.buffered())
        return server_write

    def reply(self, reply: Reply) -> Iterable[bytes]:
        if reply.kind is ReplyKind.SENT:
            return self.stream if self.stream is not None else []
        if reply.kind is ReplyKind.PASS:
            environ = self.environ if self.body is None else self.environ_with_body()
            return self.app(environ, self.start_response)
        response = reply.response
        assert response is not None
        line = self.status if reply.original and self.status else status_line(response.status)
        self.start_response(line, list(response.headers))
        return [response.body]


class _Rest:
    """The rest of an app's iterable, closed with the app's own ``close()``."""

    def __init__(self, iterator: Iterator[bytes], result: Iterable[bytes]) -> None:
        self._iterator = iterator
        self._result = result

    def __iter__(self) -> Iterator[bytes]:
        return self._iterator

    def close(self) -> None:
        _close(self._result)


def _close(result: Iterable[bytes]) -> None:
    close = getattr(result, "close", None)
    if close is not None:
        close()
