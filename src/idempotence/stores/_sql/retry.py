"""What every SQL store's I/O shares, sync or async: the retry policy for transient
errors ([`TransientError`][idempotence.stores.TransientError]), and the bookkeeping of
operations deferred to a commit ([`Blocks`][idempotence.stores.sql.Blocks]).

The connections themselves (the protocols, and the runners that feed an operation's
queries to one) are in `connection_async`, from which `connection` is
generated.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from ...errors import TransientError

__all__ = [
    "TRANSIENT_ATTEMPTS",
    "Blocks",
    "KeyHeld",
    "TransientError",
    "Translating",
    "backoff",
    "own_copy",
    "translator",
]
from .ops import APPLICATION, Op

TRANSIENT_ATTEMPTS = 5
"""How often an operation whose transaction the store owns is retried after a
serialization failure, deadlock or busy database, and the base of its backoff."""
TRANSIENT_BACKOFF = 0.005


class KeyHeld(Exception):
    """The claim that opens a transaction (F3) found the key's row held by another
    open transaction and did not wait for it (F8): its transaction rolled back. The
    store answers the claim from a read instead (`claim_held`)."""


E = TypeVar("E", bound=BaseException)


def own_copy(error: E) -> E:
    """A copy of ``error`` for one of several callers that all meet it (a batch's, a
    group commit's), the original its ``__cause__``: callers must not share one
    exception object, since each raise adds to its traceback and a handler may change
    it under the others. ``error`` itself if its type cannot be copied (a constructor
    that does not take its ``args`` back): better shared than lost."""
    try:
        mine = copy.copy(error)
    except Exception:
        return error
    mine.__cause__ = error
    return mine


def backoff(attempt: int) -> float:
    """Seconds to pause before retry ``attempt``: jittered and exponential, so that
    racing retries spread out."""
    return TRANSIENT_BACKOFF * (1 << attempt) * (0.5 + random.random())


class Blocks:
    """The operations deferred to the commit of each open transaction block of one
    connection (see [`Connection.defer`][idempotence.stores.sql.Connection.defer]), innermost last.

    A driver's ``atomic`` opens and ends the transaction; between the two it runs
    [`body`][idempotence.stores.sql.body], which runs ``first``, yields its result to
    the block, and runs what was deferred before the driver commits. An exception out of
    it, the block's own or a deferred operation's, is the driver's cue to roll back. A
    driver that sends the deferred statements with its COMMIT keeps only the
    bookkeeping: [`block`][idempotence.stores.sql.Blocks.block], then
    [`seal`][idempotence.stores.sql.Blocks.seal] before it runs them.
    """

    def __init__(self) -> None:
        self._open: list[list[Op[Any]]] = []

    def defer(self, op: Op[Any]) -> None:
        if not self._open:
            op.close()
            raise RuntimeError("defer() needs an open transaction block")
        self._open[-1].append(op)

    @contextmanager
    def block(self) -> Iterator[list[Op[Any]]]:
        """Open a block; the list collects what is deferred to its commit. Whatever
        is still in it when the block ends (it failed, or never ran them) is closed."""
        deferred = self.open()
        try:
            yield deferred
        finally:
            self.end(deferred)

    def open(self) -> list[Op[Any]]:
        """`block`'s start, for a driver whose block is a class of its own (one
        generator less per transaction): `end` must follow, whatever happens."""
        deferred: list[Op[Any]] = []
        self._open.append(deferred)
        return deferred

    def end(self, deferred: list[Op[Any]]) -> None:
        """`block`'s end: the block failed (or is done), so what it deferred and did
        not run never runs."""
        if self._open and self._open[-1] is deferred:
            self._open.pop()
        for op in deferred:
            op.close()

    def seal(self, deferred: list[Op[Any]]) -> None:
        """Nothing more is deferred to this block: its commit is under way."""
        if not self._open or self._open[-1] is not deferred:
            raise RuntimeError("transaction blocks must end innermost first")
        self._open.pop()


class Translated(Protocol):
    """A store's ``translated``: see [`translator`][idempotence.stores.sql.translator]."""

    def __call__(self, statement: str = "") -> Translating: ...


class Translating:
    """``with`` a statement: a driver error (an instance of ``errors``) raises the
    library's, ``translate(exc, own=own)``, from it. A class, not a generator: it is
    entered for every statement."""

    __slots__ = ("_errors", "_own", "_translate")

    def __init__(
        self,
        errors: type[BaseException] | tuple[type[BaseException], ...],
        translate: Callable[..., BaseException],
        *,
        own: bool,
    ) -> None:
        self._errors, self._translate, self._own = errors, translate, own

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, self._errors):
            raise self._translate(exc, own=self._own) from exc


def translator(
    errors: type[BaseException] | tuple[type[BaseException], ...],
    translate: Callable[..., BaseException],
) -> Translated:
    """A store's ``translated(statement)``: the block for the statement named
    ``statement``, where [`APPLICATION`][idempotence.stores.sql.APPLICATION] (the
    application's statement, whose errors are its own) translates with ``own=False``."""
    own = Translating(errors, translate, own=True)
    application = Translating(errors, translate, own=False)

    def translated(statement: str = "") -> Translating:
        return application if statement == APPLICATION else own

    return translated
