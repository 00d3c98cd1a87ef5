"""An ``EVALSHA`` in the Redis protocol (RESP), packed in Python for less than
hiredis's ``pack_command`` costs: every request sends a script or two, and hiredis
formats each argument's length with ``sprintf`` and copies it through its string
buffers (about 1,600 instructions an argument, callgrind: a claim's fifteen cost more
than the rest of the lane's work on it). Here the command's head (``EVALSHA``, the
script's digest, the number of keys) is made once per script and arity, each length
prefix is looked up, not formatted, and one ``join`` in C writes the command, from a
packer made once per number of arguments, written out without a loop (as
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


class _Prefixes(dict[int, bytes]):
    """The prefix of a bulk string of each length (``$<length>``), looked up."""

    def __missing__(self, length: int) -> bytes:
        return b"$%d" % length  # a long one: made, not kept


_PREFIXES = _Prefixes((n, b"$%d" % n) for n in range(1024))
_HEADS: dict[tuple[str, int, int], bytes] = {}
_PACKERS: dict[int, Callable[..., bytes]] = {}


def evalsha_packed(sha: str, keys: Sequence[bytes], args: Sequence[bytes]) -> bytes:
    """``EVALSHA sha len(keys) *keys *args`` in RESP; ``TypeError`` unless every key
    and argument is bytes."""
    count = len(keys) + len(args)
    head = _HEADS.get((sha, len(keys), count))
    if head is None:
        head = _head(sha, len(keys), count)
    pack = _PACKERS.get(count)
    if pack is None:
        pack = _PACKERS[count] = _packer(count)
    return pack(head, *keys, *args)


def _head(sha: str, keys: int, count: int) -> bytes:
    digest, number = sha.encode("ascii"), b"%d" % keys
    head = b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$%d\r\n%s" % (
        count + 3,
        len(digest),
        digest,
        len(number),
        number,
    )
    if len(_HEADS) < 256:  # the store's few scripts: never more
        _HEADS[sha, keys, count] = head
    return head


def _packer(count: int) -> Callable[..., bytes]:
    """``pack(head, a0, ..., a<count-1>)``: the head, then each argument as a bulk
    string, every part ended by CRLF (the last, empty, part ends the last one)."""
    names = [f"a{i}" for i in range(count)]
    parts = "".join(f"_prefix(len({name})), {name}, " for name in names)
    source = (
        "def __create__(_join, _prefix):\n"
        f"  def pack(head, {', '.join(names)}):\n"
        f"    return _join([head, {parts}b''])\n"
        "  return pack\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, _SOURCE, "exec"), {}, namespace)
    pack: Callable[..., bytes] = namespace["__create__"](b"\r\n".join, _PREFIXES.__getitem__)
    return pack
