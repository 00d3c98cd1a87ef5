"""JSON writers made once: what ``json.dumps`` writes, without its cost per call.

``json.dumps`` with any option builds a `json.JSONEncoder` and then a C encoder for
every value it writes; on the paths that write JSON on every request or call (a
stored response's headers, a request's canonical body, a guarded function's arguments
and return value), that construction cost more than the writing. `writer` builds the C
encoder once, with the options fixed, and returns a function of the value alone.

A writer does no check for circular references: a cycle ends in `RecursionError`
(``json.dumps`` raises `ValueError`). Callers hand it values they built, or catch it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["writer"]

_c_make_encoder: Any = json.encoder.c_make_encoder  # type: ignore[attr-defined]
_ESCAPE, _ESCAPE_ASCII = json.encoder.encode_basestring, json.encoder.encode_basestring_ascii


def _refuse(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def writer(
    *,
    sort_keys: bool = False,
    ensure_ascii: bool = True,
    allow_nan: bool = True,
    compact: bool = False,
    default: Callable[[Any], Any] = _refuse,
) -> Callable[[Any], str]:
    """A function that writes a value as ``json.dumps`` does with these options
    (``compact``: ``separators=(",", ":")``), byte for byte: the same C encoder and
    string escapes, made once.

    ```python
    write = writer(sort_keys=True, compact=True, ensure_ascii=False)
    write({"b": [1, 2.5], "a": "é"})
    # '{"a":"é","b":[1,2.5]}'
    ```
    """
    key_separator, item_separator = (":", ",") if compact else (": ", ", ")
    escape = _ESCAPE_ASCII if ensure_ascii else _ESCAPE
    if _c_make_encoder is None:  # pragma: no cover - CPython always has the C encoder
        encoder = json.JSONEncoder(
            ensure_ascii=ensure_ascii,
            allow_nan=allow_nan,
            sort_keys=sort_keys,
            separators=(item_separator, key_separator),
            default=default,
            check_circular=False,
        )
        return encoder.encode
    encode = _c_make_encoder(
        None, default, escape, None, key_separator, item_separator, sort_keys, False, allow_nan
    )

    def write(value: Any) -> str:
        return "".join(encode(value, 0))

    return write
