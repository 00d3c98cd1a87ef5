"""A stored response's headers on Redis: written as JSON by a finish, read back by a
replay (DESIGN 8). An endpoint's answers mostly carry the same headers, and a JSON
encode or decode costs a request about as much as the rest of its arguments or its
record: each side keeps the headers it met, at most ``KEPT`` of them, each of at most
``LONGEST`` bytes of JSON; past that, it forgets them all and starts again.

No I/O here.
"""

from __future__ import annotations

import json
from typing import Any

from ... import _json

KEPT = 256
"""How many headers each side keeps (see the module)."""
LONGEST = 2048
"""The longest headers' JSON, in bytes, that either side keeps."""

# The headers' JSON as json.dumps writes it (its separators, ASCII only), from a writer
# made once: json.dumps makes an encoder per call, a share of every finish. A tuple is
# an array, as a list is.
to_json = _json.writer()
_written: dict[Any, bytes] = {}
_read: dict[bytes, tuple[tuple[str, str], ...]] = {}


def write(headers: Any) -> bytes:
    """``headers`` (a stored response's pairs) as JSON, in UTF-8. Looked up and kept
    only when every name and value is a plain str, in tuples: those cannot change, and
    an equal key is then the same text (a str subclass may call a name equal to
    another's that it does not write alike: one that ignores case)."""
    if not _text_pairs(headers):
        return to_json(headers).encode()
    written = _written.get(headers)
    if written is None:
        written = to_json(headers).encode()
        if len(written) <= LONGEST:
            if len(_written) >= KEPT:
                _written.clear()
            _written[headers] = written
    return written


def _text_pairs(headers: Any) -> bool:
    # A loop, not all() over generators: it runs for every finish.
    if type(headers) is not tuple:
        return False
    for pair in headers:
        if type(pair) is not tuple or len(pair) != 2:
            return False
        name, value = pair
        if type(name) is not str or type(value) is not str:
            return False
    return True


def read(raw: bytes) -> tuple[tuple[str, str], ...]:
    """A stored response's headers from their JSON, decoded once per text into pairs
    no one can change."""
    headers = _read.get(raw)
    if headers is None:
        headers = tuple([(str(k), str(v)) for k, v in json.loads(raw)])
        if len(raw) <= LONGEST:
            if len(_read) >= KEPT:
                _read.clear()
            _read[raw] = headers
    return headers
