"""Request fingerprints: SHA-256 over the canonical request (DESIGN 2, P2).

A retry must fingerprint the same as the original even if the client re-serialised its
body, and a different request under the same key must not. So the body is compared by
meaning where its content type has one:

* JSON (``application/json``, ``application/*+json``): parsed, then written back with
  sorted keys and no insignificant whitespace. Numbers compare by exact decimal value:
  ``1``, ``1.0``, ``1.00`` and ``1e0`` are the same number, ``0.1`` and
  ``0.10000000000000000001`` are not (no float rounding, so different amounts always
  differ). A leading UTF-8 BOM is ignored (RFC 8259 8.1); NaN and Infinity are not JSON.
  Duplicate object keys keep the last value, as `json.loads` does for the app.
* ``application/x-www-form-urlencoded``: parsed into pairs, sorted by (name, value),
  re-encoded. Percent-decoding works on bytes, so no two different values collide.
* ``multipart/form-data``: its parts (name, file name, content type, bytes), sorted
  and length-prefixed, so a browser's new random boundary on a second submit of the
  same form is the same request.
* anything else: the raw bytes.

Fields can be excluded (a timestamp the client regenerates on each retry, say): for JSON
a top-level name or a dotted path into nested objects (``"meta.sent_at"``; a name that
itself contains a dot cannot be addressed); for forms a field name, taken literally.
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
from idempotence.errors import ConfigurationError, InvalidBody

__all__ = [
    "Hasher",
    "canonical_body",
    "digest",
    "fingerprint",
    "fingerprint_secret",
    "media_type",
    "secret_pair",
]

# Bump the version if the canonical form ever changes: stored fingerprints made with the
# old form would otherwise all turn into MISMATCH on the next retry, silently.
_DOMAIN = b"idempotence.fingerprint.v1"
_FORM = "application/x-www-form-urlencoded"
_PLAIN_EXPONENT = 20
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
    """Return the hex SHA-256 fingerprint of a request (DESIGN 2).

    With ``secret`` (see [`fingerprint_secret`][idempotence.fingerprint.fingerprint_secret])
    the fingerprint is an HMAC-SHA-256 keyed by it: whoever reads the key store cannot
    test a guess of a request's body (a card number, an amount) against it.

    The method is upper-cased, the path used as given (include the query string in it
    if it selects what the request does), the body canonicalised by its content type.

    ```python
    a = fingerprint("post", "/charges", b'{"amount": 100, "to": "x"}', "application/json")
    b = fingerprint("POST", "/charges", b'{"to":"x","amount":100}', "application/json")
    a == b, len(a)
    # (True, 64)
    ```

    Raises [`InvalidBody`][idempotence.errors.InvalidBody] when a JSON body is not valid JSON.
    """
    # A tuple (what the HTTP integrations pass) is already what _names would return.
    excluded = exclude if type(exclude) is tuple else _names(exclude)
    kind = media_type(content_type)
    return digest(method, path, kind, _canonical(body, kind, excluded, content_type), secret=secret)


def fingerprint_secret(value: str | bytes | None, owner: str) -> bytes | None:
    """A fingerprint secret as bytes (a str is taken as UTF-8), or None for none.

    Raises [`ConfigurationError`][idempotence.errors.ConfigurationError] (naming
    ``owner``, the option) for an empty secret or one of another type.

    ```python
    fingerprint_secret("s3cret", "Idempotency.fingerprint_secret")
    # b's3cret'
    ```
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, bytes) or not value:
        raise ConfigurationError(
            f"{owner} must be a non-empty str or bytes (or None for plain SHA-256), not {value!r}"
        )
    return value


def secret_pair(
    current: str | bytes | None, previous: str | bytes | None, owner: str
) -> tuple[bytes | None, bytes | None]:
    """The current and previous fingerprint secrets of ``owner``'s options
    ``fingerprint_secret`` and ``previous_fingerprint_secret``, as bytes.

    Raises [`ConfigurationError`][idempotence.errors.ConfigurationError] for an invalid
    secret, or a previous secret without a current one.
    """
    now = fingerprint_secret(current, f"{owner}.fingerprint_secret")
    before = fingerprint_secret(previous, f"{owner}.previous_fingerprint_secret")
    if before is not None and now is None:
        raise ConfigurationError(
            f"{owner}.previous_fingerprint_secret needs fingerprint_secret: the previous "
            "secret is only compared against, new keys use the current one"
        )
    return now, before


def digest(
    method: str, path: str, kind: str, canonical: bytes, *, secret: bytes | None = None
) -> str:
    """The fingerprint of a request whose body is already in canonical form
    (``canonical``, of media type ``kind``): what
    [`fingerprint`][idempotence.fingerprint.fingerprint] hashes once it has
    canonicalised the body. A caller that makes the canonical form itself (a guarded
    function's arguments, written as sorted JSON) skips the parse."""
    framed = _framed(method, path, kind, canonical)
    if secret is not None:
        return hmac.new(secret, framed, hashlib.sha256).hexdigest()
    return hashlib.sha256(framed).hexdigest()


def _framed(method: str, path: str, kind: str, canonical: bytes) -> bytes:
    """The bytes hashed: the parts of the request, each after its length."""
    # Each part is length-prefixed, so no choice of method, path or body can shift bytes
    # from one part into another ("POST" + "/x" never equals "POS" + "T/x").
    # The media type is hashed too: the same bytes sent as another type are another
    # request (text/plain is not application/json), and a JSON body can never collide
    # with a raw body that happens to equal its canonical form. Parameters such as
    # charset are not part of it.
    target = path.encode("utf-8", "surrogatepass")
    size, length = len(target), len(canonical)
    # One update with the parts joined hashes the same bytes as an update per piece.
    return b"".join(
        (
            _OPENINGS.get(method) or _opening(method),
            _LENGTHS[size] if size < _TABLED else size.to_bytes(8, "big"),
            target,
            _MEDIA.get(kind) or _media(kind),
            _LENGTHS[length] if length < _TABLED else length.to_bytes(8, "big"),
            canonical,
        )
    )


def _opening(method: str) -> bytes:
    verb = method.upper().encode("utf-8", "surrogatepass")
    return _remember(_OPENINGS, method, b"".join((_DOMAIN, len(verb).to_bytes(8, "big"), verb)))


def _media(kind: str) -> bytes:
    media = kind.encode("utf-8", "surrogatepass")
    return _remember(_MEDIA, kind, len(media).to_bytes(8, "big") + media)


def _remember(cache: dict[str, bytes], key: str, framed: bytes) -> bytes:
    # Methods and media types come from the client: a bounded cache, emptied when full.
    if len(cache) >= _REMEMBERED:
        cache.clear()
    cache[key] = framed
    return framed


# The framing of the few methods and media types a server sees is made once each, and
# lengths below _TABLED are framed from a table: str.encode and int.to_bytes took over
# a third of digest's instructions, more than hashing a small body.
_OPENINGS: dict[str, bytes] = {}
_MEDIA: dict[str, bytes] = {}
_REMEMBERED = 64
_TABLED = 256
_LENGTHS = tuple(size.to_bytes(8, "big") for size in range(_TABLED))


class Hasher:
    """[`digest`][idempotence.fingerprint.digest] for one method, path and media type,
    prepared once: their framing is hashed (under the secret, if any) when the hasher
    is made, and each call hashes a copy of that state on with the canonical body. For
    an entry point that fingerprints many requests of one kind (a guarded function's
    calls), the same fingerprints for less work each.

    ```python
    hasher = Hasher("CALL", "orders.charge", "application/json")
    hasher(b'{"amount":5}') == digest("CALL", "orders.charge", "application/json", b'{"amount":5}')
    # True
    ```
    """

    __slots__ = ("_state",)

    def __init__(self, method: str, path: str, kind: str, *, secret: bytes | None = None) -> None:
        head = _framed(method, path, kind, b"")[:-8]  # all but the body and its length
        self._state: Any = (
            hashlib.sha256(head) if secret is None else hmac.new(secret, head, hashlib.sha256)
        )

    def __call__(self, canonical: bytes) -> str:
        """The fingerprint of ``canonical``, a body in canonical form."""
        state = self._state.copy()
        state.update(len(canonical).to_bytes(8, "big") + canonical)
        hexdigest: str = state.hexdigest()
        return hexdigest


def media_type(content_type: str | None) -> str:
    """The lower-cased ``type/subtype`` of a Content-Type, parameters dropped.

    ```python
    media_type("Application/JSON; charset=utf-8")
    # 'application/json'
    ```
    """
    if content_type is None:
        return ""
    return content_type.split(";", 1)[0].strip(" \t").lower()


def canonical_body(
    body: bytes, content_type: str | None = None, exclude: Iterable[str] = ()
) -> bytes:
    """Return the body in the canonical form that
    [`fingerprint`][idempotence.fingerprint.fingerprint] hashes.

    Useful to see why two requests fingerprint differently.

    ```python
    canonical_body(b'{ "b": [1.50, 2], "a": null }', "application/json")
    # b'{"a":null,"b":[1.5,2]}'
    canonical_body(b"b=2&a=1&c=x", "application/x-www-form-urlencoded", exclude=["c"])
    # b'a=1&b=2'
    ```
    """
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
    if kind == FORM_DATA:  # the boundary is a parameter: the full Content-Type is needed
        return canonical_multipart(body, content_type, frozenset(exclude))
    return bytes(body)


def _names(exclude: Iterable[str]) -> tuple[str, ...]:
    # A bare string is an Iterable[str] too, and would exclude each of its letters.
    if isinstance(exclude, str):
        raise TypeError(f"exclude must be a collection of field names, not the string {exclude!r}")
    return tuple(exclude)


def _canonical_json(body: bytes, exclude: Iterable[str]) -> bytes:
    value = _read_json(body)
    for path in exclude:
        _remove_path(value, path.split("."))
    try:
        try:
            # Strings, integers written plainly (see _integer), true, false and null
            # come out of the C encoder exactly as _dump writes them; a Decimal makes
            # it call _not_plain, and the whole value is written by _dump instead.
            text = _encode_plain(value)
        except _NotPlain:
            text = _dump(value)
        return text.encode("utf-8", "surrogatepass")
    except RecursionError as exc:  # pragma: no cover - the parser gives up first
        raise InvalidBody("The request body is JSON nested too deeply to read.") from exc


def _read_json(body: bytes) -> Any:
    # The usual body (UTF-8, valid JSON, no BOM, no leading whitespace) is read by the
    # decoder's C scanner directly: _DECODER.decode's Python layers and its regex for
    # leading whitespace cost more than the whole scan of a small body. Any other body
    # (the scanner stops at once on a BOM or a space) is read again by
    # _read_json_checked, which makes every value and every error as it always has.
    try:
        text = body.decode()
        # In a body of at most _PLAIN_DIGITS bytes without a run of more than
        # _PLAIN_EXPONENT zeros, _integer reads every integer with int(): the C scanner
        # does that itself, without a call into Python per integer.
        plain = len(body) <= _PLAIN_DIGITS and _ZEROS not in body
        value, end = (_scan_plain if plain else _scan)(text, 0)
        if end == len(text) or _whitespace(text, end).end() == len(text):
            return value
    except (ValueError, StopIteration, InvalidBody, RecursionError):
        pass
    return _read_json_checked(body)


def _read_json_checked(body: bytes) -> Any:
    try:
        # Without a BOM, utf-8 (decoded in C) reads what utf-8-sig (a Python codec) does.
        text = body.decode("utf-8-sig" if body.startswith(_BOM) else "utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidBody(
            f"The request body is not valid UTF-8 (byte {exc.start} is 0x{body[exc.start]:02X}):"
            " JSON must be sent as UTF-8."
        ) from exc
    try:
        if text.startswith("\ufeff"):  # as json.loads says of a second BOM
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise InvalidBody(
            # Some messages end in "at" ("Invalid control character at"); ours adds it.
            f"The request body is not valid JSON: {exc.msg.removesuffix(' at')} "
            f"at line {exc.lineno}, column {exc.colno} (character {exc.pos})."
        ) from exc
    except RecursionError as exc:
        raise InvalidBody("The request body is JSON nested too deeply to read.") from exc
    return value


class _Literal:
    """A number kept as written, because Decimal cannot hold its exponent. Not a str,
    so that the C encoder refuses it (see _canonical_json) instead of quoting it."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _number(text: str) -> Decimal | _Literal:
    try:
        return Decimal(text)
    except InvalidOperation:
        # An exponent beyond 10**18 ("1e99999999999999999999"). Python's own parser reads
        # it as inf or 0, so we would rather not reject it; as written, it still never
        # equals a different number, only perhaps another spelling of itself.
        return _Literal(text)


def _reject_constant(name: str) -> Any:
    # json.loads accepts NaN and Infinity by default; RFC 8259 does not, and neither do
    # we, rather than invent a canonical form for values no payments request needs.
    raise InvalidBody(f"The request body is not valid JSON: {name} is not a JSON number.")


def _integer(text: str) -> int | Decimal | _Literal:
    # An integer whose canonical form (_dump_number) is the plain digits is kept as an
    # int, which the C encoder writes as those digits: one with more trailing zeros
    # than _PLAIN_EXPONENT is written with an exponent ("1E+21"), and one too long for
    # int() (sys.get_int_max_str_digits) stays a Decimal.
    if len(text) > _PLAIN_DIGITS or len(text) - len(text.rstrip("0")) > _PLAIN_EXPONENT:
        return _number(text)
    return int(text)


_PLAIN_DIGITS = 1000
"""Integers up to this many characters are read as int (well below the 4300 digits
int() accepts by default)."""


class _NotPlain(Exception):
    """The value holds a number the C encoder cannot write canonically."""


def _not_plain(value: Any) -> Any:
    raise _NotPlain()


# One decoder for every body: json.loads given hooks builds a decoder and its scanner
# per call (a measurable share of a guarded request).
_DECODER = json.JSONDecoder(
    parse_float=_number, parse_int=_integer, parse_constant=_reject_constant
)
# What _read_json calls directly: the decoders' scanners (the one without parse_int
# reads integers in C) and the whitespace pattern JSONDecoder.decode skips with.
_scan: Any = _DECODER.scan_once  # type: ignore[attr-defined]
_scan_plain: Any = json.JSONDecoder(  # type: ignore[attr-defined]
    parse_float=_number, parse_constant=_reject_constant
).scan_once
_whitespace: Any = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]
_ZEROS = b"0" * (_PLAIN_EXPONENT + 1)
# The canonical form of a value without a Decimal: the same separators, key order and
# string escapes as _dump (encode_basestring is the C function both use), from a
# writer made once. No circular check: a parsed value has no cycles.
_encode_plain = writer(sort_keys=True, ensure_ascii=False, compact=True, default=_not_plain)


def _remove_path(value: Any, path: list[str]) -> None:
    # Paths walk objects only; a path that meets a missing name, an array or a scalar
    # removes nothing.
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
    if type(value) is int:  # not a bool: those are constants
        return str(value)  # kept an int by _integer only when this is its canonical form
    if isinstance(value, _Literal):
        return value.text
    if isinstance(value, str):
        return _dump_str(value)
    return _CONSTANTS[value]


_CONSTANTS = {True: "true", False: "false", None: "null"}

# What json.dumps(value, ensure_ascii=False) writes for a str, without building an
# encoder per call: the same C function, so the canonical form is unchanged.
_dump_str = json.encoder.encode_basestring


def _dump_number(number: Decimal) -> str:
    # Strip trailing zeros by hand: Decimal.normalize() rounds to the context precision
    # (28 digits), which would make long, different numbers equal.
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # NaN and Infinity were rejected while parsing
    if not any(digits):
        return "0"  # 0, -0, 0.000 and 0e5 are the same value
    while digits[-1] == 0:
        digits = digits[:-1]
        exponent += 1
    if 0 < exponent <= _PLAIN_EXPONENT:
        # Readable integers ("1500", not "1.5E+3"); a bound, so 1e999999 stays short.
        digits, exponent = digits + (0,) * exponent, 0
    # str() of a Decimal is exact and valid JSON ("1.5", "1E+21", "-1.23E-7").
    return str(Decimal((sign, digits, exponent)))


def _canonical_form(body: bytes, exclude: Iterable[str]) -> bytes:
    # latin-1 maps bytes to characters one to one, so percent-decoding and re-encoding
    # round-trip any bytes exactly; decoding as UTF-8 would turn every invalid sequence
    # into U+FFFD and make different values collide.
    names = {name.encode("utf-8").decode("latin-1") for name in exclude}
    pairs = urllib.parse.parse_qsl(
        body.decode("latin-1"), keep_blank_values=True, encoding="latin-1", errors="strict"
    )
    kept = sorted(pair for pair in pairs if pair[0] not in names)
    return urllib.parse.urlencode(kept, encoding="latin-1").encode("ascii")
