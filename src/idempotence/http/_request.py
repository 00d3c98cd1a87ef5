"""What the middleware reads from a request, without I/O: the key header, the declared
length, the fingerprint, and a flow's parameters.

[`RequestInfo`][idempotence.http.wsgi.RequestInfo] is the framework-neutral view of a
request that a scope callable receives; ``raw`` is the framework's own object (the ASGI
scope, the WSGI environ, a Django ``HttpRequest``) for whatever else a tenant lookup
needs.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._frozen import quick_init
from .._multipart import FORM_DATA, parse_multipart
from ..errors import InvalidBody, InvalidKey, MissingKey
from ..fingerprint import fingerprint, media_type
from ..keys import parse_idempotency_key_header, validate_key

__all__ = ["RequestInfo"]

KEY_HEADER = "idempotency-key"


@quick_init
@dataclass(frozen=True, slots=True)
class RequestInfo:
    """A request as the middleware sees it: what a scope callable receives.

    ``headers`` are ``(name, value)`` pairs in arrival order, names lower-cased,
    values decoded as latin-1 (as HTTP field bytes are).

    ```python
    request = RequestInfo("POST", "/v1/charges", headers=(("x-account", "acct_1"),))
    request.header("X-Account")
    # 'acct_1'
    ```
    """

    method: str
    path: str
    query: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    raw: Any = None
    """The framework's own request: ASGI scope, WSGI environ, or Django HttpRequest."""
    path_params: Mapping[str, str] = field(default_factory=dict)
    """Values of the ``{name}`` segments of the endpoint pattern that matched."""

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        name = name.lower()
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def header_values(self, name: str) -> list[str]:
        """Every value of header ``name``, one per field line."""
        name = name.lower()
        return [value for key, value in self.headers if key == name]

    @property
    def target(self) -> str:
        """The path with its query string: what the fingerprint hashes (a query may
        select what a request does)."""
        return f"{self.path}?{self.query}" if self.query else self.path


_PATH_SAFE = "/:@!$&'()*+,;=-._~"
"""What the endpoint part of a per-endpoint scope may hold unencoded: a path's own
characters, never a space (so the tenant ends before the last two spaces)."""


def endpoint_scope(tenant: str, request: RequestInfo) -> str:
    """The scope of a key unique per endpoint (``KeyScope.ENDPOINT``): the tenant,
    the method and the path (not the query), the path percent-encoded.

    ```python
    endpoint_scope("acct 1", RequestInfo("POST", "/v1/orders/a b"))
    # 'acct 1 POST /v1/orders/a%20b'
    ```
    """
    return f"{tenant} {request.method} {urllib.parse.quote(request.path, safe=_PATH_SAFE)}"


def read_key(values: list[str], *, required: bool) -> str | None:
    """The idempotency key from every ``Idempotency-Key`` field line (P7, P8).

    Two field lines are refused: which one would we honour? A bare (unquoted) value
    with a comma is refused too, because a WSGI server folds two field lines into
    one comma-separated value and we could not tell the two apart; a key with a
    comma can always be sent quoted.
    """
    if len(values) > 1:
        raise RepeatedKey(
            f"The request has {len(values)} Idempotency-Key headers: send exactly one."
        )
    if not values:
        return parse_idempotency_key_header(None, required=required)
    value = values[0]
    if "," in value and not value.strip(" \t").startswith('"'):
        raise RepeatedKey(
            "The Idempotency-Key holds a comma outside quotes, which is how two "
            'Idempotency-Key headers look once combined: send one key, quoted ("a,b") '
            "if it contains a comma."
        )
    return parse_idempotency_key_header(value, required=required)


class RepeatedKey(InvalidKey):
    """The request carries more than one Idempotency-Key."""


def form_key(request: RequestInfo, body: bytes, field: str, *, required: bool) -> str | None:
    """The idempotency key from form field ``field`` of a form-encoded or
    ``multipart/form-data`` body (``Policy.key_field``), for an HTML form, which
    cannot send headers. The value is the key as is (no header quoting).

    ```python
    info = RequestInfo(
        "POST", "/orders", headers=(("content-type", "application/x-www-form-urlencoded"),)
    )
    form_key(info, b"item=tea&idempotency_key=k-1", "idempotency_key", required=True)
    # 'k-1'
    ```
    """
    content_type = request.header("content-type")
    kind = media_type(content_type)
    values: list[str] = []
    if kind == "application/x-www-form-urlencoded":
        try:
            pairs = urllib.parse.parse_qsl(
                body.decode("latin-1"), keep_blank_values=True, encoding="utf-8", errors="strict"
            )
        except UnicodeDecodeError as exc:
            raise InvalidKey(f"The {field} form field is not valid UTF-8.") from exc
        values = [value for name, value in pairs if name == field]
    elif kind == FORM_DATA and body:
        for part in parse_multipart(body, content_type):
            if part.name == field:
                try:
                    values.append(part.data.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise InvalidKey(f"The {field} form field is not valid UTF-8.") from exc
    if len(values) > 1:
        raise RepeatedKey(f"The form has {len(values)} {field} fields: send exactly one.")
    if not values:
        if required:
            raise MissingKey(
                f"The request has no Idempotency-Key header and no {field} form field:"
                " send one of them."
            )
        return None
    try:
        return validate_key(values[0])
    except InvalidKey as exc:
        raise InvalidKey(f"The {field} form field is not a valid key: {exc.message}") from exc


def framing(request: RequestInfo) -> tuple[list[str], str | None, str | None]:
    """Every ``Idempotency-Key`` field line of ``request``, and its (first)
    Content-Length and Content-Type: what every guarded request reads of its headers,
    in one pass over them rather than one each."""
    keys: list[str] = []
    length = kind = None
    for name, value in request.headers:
        if name == KEY_HEADER:
            keys.append(value)
        elif name == "content-length":
            if length is None:
                length = value
        elif name == "content-type" and kind is None:
            kind = value
    return keys, length, kind


def declared_length(value: str | None) -> int | None:
    """The Content-Length the client declared (the header's ``value``), if it is a
    number."""
    if value is None:
        return None
    value = value.strip()
    return int(value) if value.isdigit() else None


def request_fingerprint(
    request: RequestInfo, body: bytes, exclude: Iterable[str] = (), *, secret: bytes | None = None
) -> str:
    """The fingerprint of ``request`` with ``body`` (DESIGN 2), as the middleware
    computes it: method, path with query string, media type, canonical body; keyed by
    ``secret`` (HMAC-SHA-256) when given.

    ```python
    info = RequestInfo("POST", "/x", headers=(("content-type", "application/json"),))
    one = request_fingerprint(info, b'{"a": 1, "b": 2}')
    one == request_fingerprint(info, b'{"b":2,"a":1}')
    # True
    ```
    """
    content_type = request.header("content-type")
    return fingerprint(
        request.method, request.target, body, content_type, exclude=exclude, secret=secret
    )


def flow_params(request: RequestInfo, body: bytes) -> Any:
    """A flow's parameters from the request body: parsed JSON, or a form as a dict
    (a repeated field becomes a list). An empty body is ``{}``.

    Raises `UnsupportedBody` for other content types and
    [`InvalidBody`][idempotence.fingerprint.InvalidBody] for a body that does not parse.
    """
    if not body:
        return {}
    kind = media_type(request.header("content-type"))
    if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
        try:
            return json.loads(body.decode("utf-8-sig"))
        except (UnicodeDecodeError, ValueError) as exc:  # the fingerprint said it parses
            raise InvalidBody(f"The request body is not valid JSON: {exc}") from exc
    if kind == "application/x-www-form-urlencoded":
        form: dict[str, Any] = {}
        text = body.decode("utf-8", "replace")
        for name, value in urllib.parse.parse_qsl(text, keep_blank_values=True):
            if name in form:
                previous = form[name]
                form[name] = [*previous, value] if isinstance(previous, list) else [previous, value]
            else:
                form[name] = value
        return form
    raise UnsupportedBody(
        f"This endpoint reads JSON or form-encoded bodies, not {kind or 'a body without type'}:"
        " send Content-Type: application/json."
    )


class UnsupportedBody(InvalidBody):
    """The body's content type is not one a flow endpoint reads."""

    status = 415
