"""What ``@idempotent`` was told, in one value (DESIGN 12).

The decorator's keyword arguments are documented once, on
[`idempotent`][idempotence.functions.decorator.idempotent]; they travel from there to
the guard as one frozen `Options`, so the list is written once more here and nowhere
else. `Options.check` refuses, at decoration, the values that cannot work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import ConfigurationError
from ..states import DEFAULT_HANDLER_LOCK_TIMEOUT, DEFAULT_RETENTION

__all__ = ["MAX_WAIT", "Options", "Selector", "Serializer"]

Selector = str | Callable[..., Any]
"""How a key or scope is chosen: an argument name, a dotted path, or a callable."""
Serializer = tuple[Callable[[Any], Any], Callable[[Any], Any]]
"""``(dump, load)``: a value to a JSON value, and back."""
MAX_WAIT = timedelta(minutes=5)
"""The longest ``wait=``: a caller blocked longer has long been given up on."""


@dataclass(frozen=True, slots=True)
class Options:
    """The options of one ``@idempotent``, as given (see
    [`idempotent`][idempotence.functions.decorator.idempotent] for each)."""

    key: Selector
    scope: Selector | None = None
    name: str | None = None
    fingerprint_exclude: Iterable[str] = ()
    serializer: Serializer | None = None
    final_exceptions: Iterable[type[BaseException]] = ()
    wait: timedelta | None = None
    lock_timeout: timedelta = DEFAULT_HANDLER_LOCK_TIMEOUT
    heartbeat: timedelta | None = None
    retention: timedelta | None = DEFAULT_RETENTION
    transactional: bool = False
    fingerprint_secret: str | bytes | None = None
    previous_fingerprint_secret: str | bytes | None = None

    def check(self, owner: str) -> None:
        """Refuse the times that cannot work (``owner`` names the decorated function);
        the selectors, exceptions, serializer and secrets are checked where they are
        used."""
        wait, lock, heartbeat = self.wait, self.lock_timeout, self.heartbeat
        if wait is not None and not timedelta(0) < wait <= MAX_WAIT:
            raise ConfigurationError(
                f"{owner}: wait={wait!r} must be positive and at most 5 minutes"
            )
        if lock <= timedelta(0):
            raise ConfigurationError(f"{owner}: lock_timeout={lock!r} must be positive")
        if heartbeat is not None and not timedelta(0) < heartbeat < lock:
            raise ConfigurationError(
                f"{owner}: heartbeat={heartbeat!r} must be positive and shorter than "
                f"lock_timeout={lock!r}, or the lock lapses between two beats"
            )
        if heartbeat is not None and self.transactional:
            raise ConfigurationError(
                f"{owner}: heartbeat= needs transactional=False: a transactional call "
                "holds its key by its open transaction, and nothing beats"
            )
        retention = self.retention
        if retention is not None and retention <= timedelta(0):
            raise ConfigurationError(f"{owner}: retention={retention!r} must be positive, or None")
