"""The vocabulary between the lifecycle (`_core`) and its driver: the effects
that are HTTP's own (reading the scope and the body; for asynchronous acceptance,
reading a key and starting a flow in the background; reading a key's status;
everything else that touches the store is an engine effect,
`idempotence.flows.effects`), the response the app sent, and the reply that goes back.

Plain data, no I/O; `Capture` is the one stateful piece, the buffer an
exchange fills as the app sends its response.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias

from .._frozen import quick_init
from ..flows.effects import Effect as EngineEffect
from ..flows.flow import Flow
from ..flows.results import Captured, new_captured
from ..states import ClaimRequest, StoredResponse
from ._config import ScopeFn
from ._request import RequestInfo

__all__ = [
    "Capture",
    "Captured",
    "Effect",
    "Detach",
    "ReadBody",
    "ReadKey",
    "ReadStatus",
    "Reply",
    "ReplyKind",
    "ResolveScope",
]

# -- effects: what the lifecycle asks its driver to do ------------------------------------


@quick_init
@dataclass(frozen=True, slots=True)
class ResolveScope:
    """Call ``fn(request)`` (awaiting it in ASGI if it is a coroutine); returns the tenant."""

    fn: ScopeFn
    request: RequestInfo


@quick_init
@dataclass(frozen=True, slots=True)
class ReadBody:
    """Read the whole request body; raise BodyTooLarge past ``limit`` bytes."""

    limit: int


@quick_init
@dataclass(frozen=True, slots=True)
class ReadKey:
    """Read the key's record without claiming it; returns a KeyRecord or None."""

    scope: str
    key: str


@quick_init
@dataclass(frozen=True, slots=True)
class ReadStatus:
    """Read the key's status on the store's clock (``store.key_status``); returns a
    KeyStatus or None."""

    scope: str
    key: str


@quick_init
@dataclass(frozen=True, slots=True)
class Detach:
    """Start ``flow`` on ``request`` in the background (a task, or a thread) and
    return at once: asynchronous acceptance. The run is the engine's own, the same
    the completer makes (B2), so a crash of the server leaves it to the completer."""

    flow: Flow
    request: ClaimRequest


Effect: TypeAlias = ResolveScope | ReadBody | ReadKey | ReadStatus | Detach | EngineEffect

# -- what the app sent, and what goes back -------------------------------------------------


class Capture:
    """A response as the app sends it, buffered up to ``limit`` body bytes.

    ```python
    capture = Capture(limit=4)
    capture.start(201, [("Content-Type", "text/plain")])
    capture.add(b"abc"), capture.add(b"de")
    # (False, True)
    ```
    """

    __slots__ = ("chunks", "headers", "limit", "overflowed", "size", "status")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.status: int | None = None
        self.headers: tuple[tuple[str, str], ...] = ()
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflowed = False

    def start(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        self.status = status
        self.headers = tuple(headers)

    def add(self, chunk: bytes) -> bool:
        """Buffer ``chunk``; True exactly once: when the body first exceeds the limit."""
        self.size += len(chunk)
        if self.overflowed:
            return False
        self.chunks.append(chunk)
        if self.size > self.limit:
            self.overflowed = True
            return True
        return False

    def buffered(self) -> bytes:
        return b"".join(self.chunks)

    def result(self) -> Captured:
        if self.status is None:
            raise RuntimeError("the application returned without starting a response")
        overflowed = self.overflowed
        body = b"" if overflowed else b"".join(self.chunks)
        return new_captured(self.status, self.headers, body, overflowed)


class ReplyKind(enum.Enum):
    RESPOND = "respond"
    """Send ``Reply.response``."""
    PASS = "pass"
    """Run the app unguarded (the body is replayed to it if it was read)."""
    SENT = "sent"
    """The response already went out, streamed (too large to buffer)."""


@quick_init
@dataclass(frozen=True, slots=True)
class Reply:
    kind: ReplyKind
    response: StoredResponse | None = None
    original: bool = False
    """The app's own response (a driver may send its original object)."""


PASS = Reply(ReplyKind.PASS)
SENT = Reply(ReplyKind.SENT)
Lifecycle: TypeAlias = Generator[Effect, Any, Reply]
