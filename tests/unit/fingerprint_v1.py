"""The request fingerprint as the library computed it before its fast paths: a frozen
copy of ``idempotence.fingerprint`` (commit 955bf62), kept as the oracle that
test_fingerprint.py compares the library with.

The canonical form is a stored contract (a changed value turns every retry in flight
into a MISMATCH), so this copy is not to be edited to follow the library: a test that
fails against it is a changed fingerprint or a changed error. Multipart bodies and the
JSON writer are the library's own (those were not changed with the fast paths).
"""

from __future__ import annotations

import codecs
import hashlib
import hmac
import json
import urllib.parse
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

from idempotence._json import writer
from idempotence._multipart import FORM_DATA, canonical_multipart
from idempotence.errors import InvalidBody

_DOMAIN = b"idempotence.fingerprint.v1"
_FORM = "application/x-www-form-urlencoded"
_PLAIN_EXPONENT = 20
_PLAIN_DIGITS = 1000
_BOM = codecs.BOM_UTF8


def fingerprint(
    method: str,
    path: str,
    body: bytes,
    content_type: str | None = None,
    *,
    exclude: Iterable[str] = (),
    secret: bytes | None = None,
) -> str:
    excluded = _names(exclude)
    kind = media_type(content_type)
    return digest(method, path, kind, _canonical(body, kind, excluded, content_type), secret=secret)


def digest(
    method: str, path: str, kind: str, canonical: bytes, *, secret: bytes | None = None
) -> str:
    framed = b"".join((_head(method, path, kind), len(canonical).to_bytes(8, "big"), canonical))
    if secret is not None:
        return hmac.new(secret, framed, hashlib.sha256).hexdigest()
    return hashlib.sha256(framed).hexdigest()


def _head(method: str, path: str, kind: str) -> bytes:
    verb = method.upper().encode("utf-8", "surrogatepass")
    target = path.encode("utf-8", "surrogatepass")
    media = kind.encode("utf-8", "surrogatepass")
    return b"".join(
        (
            _DOMAIN,
            len(verb).to_bytes(8, "big"),
            verb,
            len(target).to_bytes(8, "big"),
            target,
            len(media).to_bytes(8, "big"),
            media,
        )
    )


def media_type(content_type: str | None) -> str:
    if content_type is None:
        return ""
    return content_type.split(";", 1)[0].strip(" \t").lower()


def canonical_body(
    body: bytes, content_type: str | None = None, exclude: Iterable[str] = ()
) -> bytes:
    return _canonical(body, media_type(content_type), _names(exclude), content_type)


def _canonical(
    body: bytes, kind: str, exclude: tuple[str, ...], content_type: str | None = None
) -> bytes:
    if not body:
        return b""
    if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
        return _canonical_json(body, exclude)
    if kind == _FORM:
        return _canonical_form(body, exclude)
    if kind == FORM_DATA:
        return canonical_multipart(body, content_type, frozenset(exclude))
    return bytes(body)


def _names(exclude: Iterable[str]) -> tuple[str, ...]:
    if isinstance(exclude, str):
        raise TypeError(f"exclude must be a collection of field names, not the string {exclude!r}")
    return tuple(exclude)


def _canonical_json(body: bytes, exclude: Iterable[str]) -> bytes:
    try:
        text = body.decode("utf-8-sig" if body.startswith(_BOM) else "utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidBody(
            f"The request body is not valid UTF-8 (byte {exc.start} is 0x{body[exc.start]:02X}):"
            " JSON must be sent as UTF-8."
        ) from exc
    try:
        if text.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise InvalidBody(
            f"The request body is not valid JSON: {exc.msg.removesuffix(' at')} "
            f"at line {exc.lineno}, column {exc.colno} (character {exc.pos})."
        ) from exc
    except RecursionError as exc:
        raise InvalidBody("The request body is JSON nested too deeply to read.") from exc
    for path in exclude:
        _remove_path(value, path.split("."))
    try:
        try:
            text = _encode_plain(value)
        except _NotPlain:
            text = _dump(value)
        return text.encode("utf-8", "surrogatepass")
    except RecursionError as exc:  # pragma: no cover
        raise InvalidBody("The request body is JSON nested too deeply to read.") from exc


class _Literal:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _number(text: str) -> Decimal | _Literal:
    try:
        return Decimal(text)
    except InvalidOperation:
        return _Literal(text)


def _reject_constant(name: str) -> Any:
    raise InvalidBody(f"The request body is not valid JSON: {name} is not a JSON number.")


def _integer(text: str) -> int | Decimal | _Literal:
    if len(text) > _PLAIN_DIGITS or len(text) - len(text.rstrip("0")) > _PLAIN_EXPONENT:
        return _number(text)
    return int(text)


class _NotPlain(Exception):
    pass


def _not_plain(value: Any) -> Any:
    raise _NotPlain()


_DECODER = json.JSONDecoder(
    parse_float=_number, parse_int=_integer, parse_constant=_reject_constant
)
_encode_plain = writer(sort_keys=True, ensure_ascii=False, compact=True, default=_not_plain)


def _remove_path(value: Any, path: list[str]) -> None:
    for name in path[:-1]:
        if not isinstance(value, dict):
            return
        value = value.get(name)
    if isinstance(value, dict):
        value.pop(path[-1], None)


def _dump(value: Any) -> str:
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ",".join(f"{_dump_str(k)}:{_dump(v)}" for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return _dump_number(value)
    if type(value) is int:
        return str(value)
    if isinstance(value, _Literal):
        return value.text
    if isinstance(value, str):
        return _dump_str(value)
    return _CONSTANTS[value]


_CONSTANTS = {True: "true", False: "false", None: "null"}
_dump_str = json.encoder.encode_basestring


def _dump_number(number: Decimal) -> str:
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    if not any(digits):
        return "0"
    while digits[-1] == 0:
        digits = digits[:-1]
        exponent += 1
    if 0 < exponent <= _PLAIN_EXPONENT:
        digits, exponent = digits + (0,) * exponent, 0
    return str(Decimal((sign, digits, exponent)))


def _canonical_form(body: bytes, exclude: Iterable[str]) -> bytes:
    names = {name.encode("utf-8").decode("latin-1") for name in exclude}
    pairs = urllib.parse.parse_qsl(
        body.decode("latin-1"), keep_blank_values=True, encoding="latin-1", errors="strict"
    )
    kept = sorted(pair for pair in pairs if pair[0] not in names)
    return urllib.parse.urlencode(kept, encoding="latin-1").encode("ascii")
