"""A call's key, scope and fingerprint, from its arguments (DESIGN 12, P2).

The key (and the scope) is chosen once, at decoration, as one of:

* an argument's name: ``key="order_id"``;
* a dotted path into an argument: ``key="order.id"`` reads ``order.id``, or
  ``order["id"]`` when ``order`` is a mapping, a step at a time (dataclasses, pydantic
  models, plain objects and dicts alike);
* a callable, given the call's own arguments: ``key=lambda order, **_: order.ref``.

A name is checked against the function's parameters when it is decorated, so a typo
fails at import, not at the first call.

The fingerprint is the canonical JSON (sorted keys, no whitespace; hashed as
[`idempotence.fingerprint.digest`][idempotence.fingerprint.digest] frames every
fingerprint) of the bound arguments, defaults applied, under the function's name: the
same call made again fingerprints the same whatever the order or spelling of its
arguments, and the same key with other arguments is refused (P2).
``fingerprint_exclude`` leaves arguments (or dotted paths into them) out: a timestamp, a
database session, a logger.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import ConfigurationError, InvalidKey, MissingKey
from ..fingerprint import digest
from ..keys import validate_key
from ._codec import NotStorable, to_json

__all__ = ["Picker", "Selector", "Fingerprinter"]

Selector = str | Callable[..., Any]
"""How a key or scope is chosen: an argument name, a dotted path, or a callable."""

_IMPLICIT = frozenset({"self", "cls"})
"""Parameters never fingerprinted: a method's own object or class."""


def _parameter(signature: inspect.Signature, path: str, option: str, owner: str) -> str:
    name = path.split(".", 1)[0]
    if name not in signature.parameters:
        names = ", ".join(signature.parameters) or "none"
        raise ConfigurationError(
            f"{owner}: {option}={path!r} names no parameter of the function (its "
            f"parameters: {names}); give a parameter name, a dotted path into one, or "
            "a callable that takes the function's arguments"
        )
    return name


class Picker:
    """Reads one value (a key or a scope) from a call's arguments."""

    __slots__ = ("_call", "_name", "_steps", "option")

    def __init__(
        self, selector: Selector, signature: inspect.Signature, option: str, owner: str
    ) -> None:
        self.option = option
        self._call: Callable[..., Any] | None = None
        self._name = ""
        self._steps: tuple[str, ...] = ()
        if callable(selector):
            self._call = selector
        elif isinstance(selector, str) and selector:
            self._name = _parameter(signature, selector, option, owner)
            self._steps = tuple(selector.split(".")[1:])
        else:
            raise ConfigurationError(
                f"{owner}: {option}= must be a parameter name, a dotted path or a "
                f"callable, not {selector!r}"
            )

    def pick(
        self, arguments: Mapping[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> str:
        """The value for this call, as a valid key;
        [`MissingKey`][idempotence.errors.MissingKey] when it is None,
        [`InvalidKey`][idempotence.errors.InvalidKey] when it is no key."""
        if self._call is not None:
            value = self._call(*args, **kwargs)
        else:
            value = arguments[self._name]
            for step in self._steps:
                if value is None:
                    break
                value = (
                    value.get(step) if isinstance(value, Mapping) else getattr(value, step, None)
                )
        return self._valid(value)

    def _valid(self, value: Any) -> str:
        what = self.option
        if value is None:
            raise MissingKey(
                f"this call has no {what}: its {what}= gave None. Pass the value that "
                f"identifies the operation, the same on every retry."
            )
        if isinstance(value, uuid.UUID) or (isinstance(value, int) and not isinstance(value, bool)):
            value = str(value)
        if not isinstance(value, str):
            raise InvalidKey(
                f"this call's {what} is a {type(value).__name__}: give a str (or an int "
                "or UUID), 1 to 255 printable ASCII characters"
            )
        return validate_key(value, subject=f"this call's {what}")


class Fingerprinter:
    """The fingerprint of a call: its name and its bound arguments, minus the excluded."""

    __slots__ = ("_dropped", "_exclude", "_name", "_secrets")

    def __init__(
        self,
        name: str,
        signature: inspect.Signature,
        exclude: Iterable[str],
        owner: str,
        secrets: tuple[bytes | None, bytes | None] = (None, None),
    ) -> None:
        if isinstance(exclude, str):
            raise ConfigurationError(
                f"{owner}: fingerprint_exclude={exclude!r} must be a list of names, not a str"
            )
        paths = tuple(exclude)
        for path in paths:
            _parameter(signature, path, "fingerprint_exclude", owner)
        self._name = name
        self._secrets = secrets
        # Whole arguments are dropped before they are converted (a session or a
        # logger has no JSON form); dotted paths are cut from the JSON.
        self._dropped = frozenset(p for p in paths if "." not in p) | _IMPLICIT
        self._exclude = tuple(p for p in paths if "." in p)

    def of(self, arguments: Mapping[str, Any]) -> tuple[str, str | None]:
        """The call's fingerprint, and while secrets rotate its fingerprint under the
        previous secret (None otherwise)."""
        canonical = self._canonical(arguments)
        current, previous = self._secrets
        fingerprint = digest("CALL", self._name, "application/json", canonical, secret=current)
        if previous is None:
            return fingerprint, None
        return fingerprint, digest(
            "CALL", self._name, "application/json", canonical, secret=previous
        )

    def _canonical(self, arguments: Mapping[str, Any]) -> bytes:
        data: dict[str, Any] = {}
        for name, value in arguments.items():
            if name in self._dropped:
                continue
            try:
                data[name] = to_json(value)
            except NotStorable as exc:
                raise ConfigurationError(
                    f"argument {name!r} cannot be fingerprinted ({exc}): leave it out "
                    f"with fingerprint_exclude=[{name!r}] if it does not change what the "
                    "call does"
                ) from None
        for path in self._exclude:
            _cut(data, path.split("."))
        # The canonical form is written here, from Python values (sorted keys, no
        # whitespace), and framed as every fingerprint is: no JSON text to parse back.
        return json.dumps(
            data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode("utf-8", "surrogatepass")


def _cut(value: Any, path: list[str]) -> None:
    """Remove the dotted ``path`` from the JSON ``value``, if it is there."""
    for step in path[:-1]:
        if not isinstance(value, dict):
            return
        value = value.get(step)
    if isinstance(value, dict):
        value.pop(path[-1], None)
