"""An ``EVALSHA`` in the Redis protocol (RESP), packed in Python for less than
hiredis's ``pack_command`` costs: every request sends a script or two, and hiredis
formats each argument's length with ``sprintf`` and copies it through its string
buffers (about 1,600 instructions an argument, callgrind: a claim's fifteen cost more
than the rest of the lane's work on it). Here the command's head (``EVALSHA``, the
script's digest, the number of keys) is made once per script and arity, each length
prefix is looked up, not formatted, and one ``join`` in C writes the command, from a
packer made once per script and arity, written out without a loop (as
``idempotence._frozen`` makes its ``__init__``): about half the instructions.

It packs bytes only. Any other argument (text, a number) raises ``TypeError``, and
the lane packs that command with hiredis instead: the store's own scripts send bytes.

```python
import hiredis
evalsha_packed("0" * 40, [b"k"], [b"v", b""]) == hiredis.pack_command(
    ("EVALSHA", "0" * 40, 1, b"k", b"v", b"")
)
# True
```
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["evalsha_packed"]

_SOURCE = "<resp>"


_PREFIXES = [b"$%d" % n for n in range(1024)]
"""The prefix of a bulk string of each short length (``$<length>``), looked up; a
longer one's is made (a list, not a dict: an index costs less than a key)."""
_PACKERS: dict[tuple[str, int, int], Callable[..., bytes]] = {}


def evalsha_packed(sha: str, keys: Sequence[bytes], args: Sequence[bytes]) -> bytes:
    """``EVALSHA sha len(keys) *keys *args`` in RESP; ``TypeError`` unless every key
    and argument is bytes."""
    pack = _PACKERS.get((sha, len(keys), len(args)))
    if pack is None:
        pack = _packer(sha, len(keys), len(args))
    return pack(keys, args)


def _head(sha: str, keys: int, count: int) -> bytes:
    digest, number = sha.encode("ascii"), b"%d" % keys
    return b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$%d\r\n%s" % (
        count + 3,
        len(digest),
        digest,
        len(number),
        number,
    )


def _packer(sha: str, keys: int, count: int) -> Callable[..., bytes]:
    """``pack(keys, args)`` for ``count`` arguments to script ``sha`` with ``keys``
    keys: the head, then each key and argument as a bulk string, every part ended by
    CRLF (the last, empty, part ends the last one). The lists are unpacked, not
    joined into one to pass by ``*``."""
    knames = [f"k{i}" for i in range(keys)]
    anames = [f"a{i}" for i in range(count)]
    parts = "".join(
        f"_prefix[_n] if (_n := len({name})) < 1024 else b'$%d' % _n, {name}, "
        for name in knames + anames
    )
    source = (
        "def __create__(_join, _prefix, _head):\n"
        "  def pack(keys, args):\n"
        + "".join(
            f"    {''.join(name + ', ' for name in names)}= {of}\n"
            for names, of in ((knames, "keys"), (anames, "args"))
            if names
        )
        + f"    return _join([_head, {parts}b''])\n"
        "  return pack\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, _SOURCE, "exec"), {}, namespace)
    pack: Callable[..., bytes] = namespace["__create__"](
        b"\r\n".join, _PREFIXES, _head(sha, keys, keys + count)
    )
    if len(_PACKERS) < 256:  # the store's few scripts: never more
        _PACKERS[sha, keys, count] = pack
    return pack
