"""The vocabulary between the lifecycle (:mod:`._core`) and its drivers: the effects
it asks for, the response the app sent, and the reply that goes back.

Plain data, no I/O; :class:`Capture` is the one stateful piece, the buffer a driver
fills as the app sends its response.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from ..states import ClaimRequest, Lease, StoredResponse
from ._config import ScopeFn
from ._request import RequestInfo

if TYPE_CHECKING:
    from ..flows import Flow

# -- effects: what the lifecycle asks its driver to do ------------------------------------


@dataclass(frozen=True, slots=True)
class ResolveScope:
    """Call ``fn(request)`` (awaiting it in ASGI if it is a coroutine); returns the tenant."""

    fn: ScopeFn
    request: RequestInfo


@dataclass(frozen=True, slots=True)
class ReadBody:
    """Read the whole request body; raise BodyTooLarge past ``limit`` bytes."""

    limit: int


@dataclass(frozen=True, slots=True)
class ClaimKey:
    """``store.claim(request)``: returns the :class:`~idempotence.Claim`."""

    request: ClaimRequest


@dataclass(frozen=True, slots=True)
class BeginTransaction:
    """Open ``store.transaction(claim=claim)`` and keep it open across the next
    effects; returns the claim's :class:`~idempotence.Claim` (F3: the claim is the
    transaction's first statement, sent with its BEGIN)."""

    claim: ClaimRequest


@dataclass(frozen=True, slots=True)
class EndTransaction:
    """Commit or roll back the open transaction. A failed rollback is logged, never
    raised: the transaction is gone either way."""

    commit: bool


@dataclass(frozen=True, slots=True)
class FinishKey:
    """Store the response. ``at_commit``: as the open transaction's last statement,
    sent with its COMMIT; a refused write then comes from the EndTransaction."""

    lease: Lease
    response: StoredResponse
    at_commit: bool = False
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ReleaseKey:
    lease: Lease


@dataclass(frozen=True, slots=True)
class ForgetKey:
    lease: Lease


StoreEffect: TypeAlias = FinishKey | ReleaseKey | ForgetKey


@dataclass(frozen=True, slots=True)
class WaitForTwin:
    """Wait up to ``seconds`` for the request holding ``request``'s key to progress
    (P10): ``store.wait_for_settle(scope, key, seconds)``, which may return early when
    it learns that the key settled (PostgreSQL: a NOTIFY), after which the lifecycle
    claims again."""

    request: ClaimRequest
    seconds: float


@dataclass(frozen=True, slots=True)
class RunApp:
    """Run the app on the buffered body with the lease (and, in_transaction, the open
    transaction) bound for :func:`~idempotence.http.current_transaction`; return
    :class:`Captured`.

    Past ``limit`` body bytes the driver stops buffering. With ``on_overflow`` it
    performs ``on_overflow(status)`` (a store effect), then streams the response
    through as the app produces it and returns ``Captured(overflowed=True)``;
    without, it discards the rest and returns ``Captured(overflowed=True)``.
    """

    limit: int
    lease: Lease
    in_transaction: bool
    on_overflow: Callable[[int], StoreEffect] | None


@dataclass(frozen=True, slots=True)
class RunFlow:
    """``flow.run(store, request)`` (or ``run_async``); returns the FlowResult."""

    flow: Flow
    request: ClaimRequest


Effect: TypeAlias = (
    ResolveScope
    | ReadBody
    | ClaimKey
    | BeginTransaction
    | EndTransaction
    | FinishKey
    | ReleaseKey
    | ForgetKey
    | WaitForTwin
    | RunApp
    | RunFlow
)

# -- what the app sent, and what goes back -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Captured:
    """The app's response: status, headers (as sent), body."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    overflowed: bool = False


class Capture:
    """A response as the app sends it, buffered up to ``limit`` body bytes.

    >>> capture = Capture(limit=4)
    >>> capture.start(201, [("Content-Type", "text/plain")])
    >>> capture.add(b"abc"), capture.add(b"de")
    (False, True)
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
        body = b"" if self.overflowed else self.buffered()
        return Captured(self.status, self.headers, body, self.overflowed)


class ReplyKind(enum.Enum):
    #: Send ``Reply.response``.
    RESPOND = "respond"
    #: Run the app unguarded (the body is replayed to it if it was read).
    PASS = "pass"
    #: The response already went out, streamed (too large to buffer).
    SENT = "sent"


@dataclass(frozen=True, slots=True)
class Reply:
    kind: ReplyKind
    response: StoredResponse | None = None
    #: The app's own response (a driver may send its original object).
    original: bool = False


PASS = Reply(ReplyKind.PASS)
SENT = Reply(ReplyKind.SENT)
Lifecycle: TypeAlias = Generator[Effect, Any, Reply]
