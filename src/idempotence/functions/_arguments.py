"""A call's key, scope and fingerprint, from its arguments (DESIGN 12, P2).

The key (and the scope) is chosen once, at decoration, as one of:

* an argument's name: ``key="order_id"``;
* a dotted path into an argument: ``key="order.id"`` reads ``order.id``, or
  ``order["id"]`` when ``order`` is a mapping, a step at a time (dataclasses, pydantic
  models, plain objects and dicts alike);
* a callable, given the call's own arguments: ``key=lambda order, **_: order.ref``.

A name is checked against the function's parameters when it is decorated, so a typo
fails at import, not at the first call.

The arguments are bound to the parameters' names (defaults applied) by a `Binder`,
which reads the parameters once, at decoration, rather than asking
`inspect.Signature.bind` on every call.

The fingerprint is the canonical JSON (sorted keys, no whitespace; hashed as
[`idempotence.fingerprint.digest`][idempotence.fingerprint.digest] frames every
fingerprint, by a [`Hasher`][idempotence.fingerprint.Hasher] prepared at decoration)
of the bound arguments, defaults applied, under the function's name: the
same call made again fingerprints the same whatever the order or spelling of its
arguments, and the same key with other arguments is refused (P2).
``fingerprint_exclude`` leaves arguments (or dotted paths into them) out: a timestamp, a
database session, a logger.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._json import writer
from ..errors import ConfigurationError, InvalidKey, MissingKey
from ..fingerprint import Hasher
from ..keys import MAX_KEY_LENGTH, validate_key
from ._codec import NotStorable, to_json
from ._options import Selector

__all__ = ["Binder", "Fingerprinter", "Picker", "Selector"]

_IMPLICIT = frozenset({"self", "cls"})
"""Parameters never fingerprinted: a method's own object or class."""


_EMPTY: Any = inspect.Parameter.empty
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})
"""Arguments written as they are (by exact type: an enum member is converted)."""
_CANONICAL = writer(sort_keys=True, ensure_ascii=False, allow_nan=False, compact=True)
"""The canonical JSON: sorted keys, no whitespace, text as it is (hashed as UTF-8)."""


class Binder:
    """A call's arguments by parameter name, in the parameters' order, defaults
    applied: ``signature.bind(*args, **kwargs)`` then ``apply_defaults()``, from the
    parameters read once.

    A function whose parameters are all plain (no ``*args``, ``**kwargs`` or
    positional-only ones) is bound here; any other, and any call that does not fit
    its parameters (a missing, unknown or repeated argument), is bound by
    `inspect.Signature.bind`, which raises the `TypeError` that calling the
    function would.
    """

    __slots__ = ("_defaults", "_names", "_plain", "_positional", "_signature")

    def __init__(self, signature: inspect.Signature) -> None:
        parameters = tuple(signature.parameters.values())
        self._signature = signature
        self._plain = all(parameter.kind in _NAMED for parameter in parameters)
        self._names = tuple(parameter.name for parameter in parameters)
        self._defaults = tuple(parameter.default for parameter in parameters)
        self._positional = sum(
            parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for parameter in parameters
        )

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arguments of a call with ``args`` and ``kwargs``, by name."""
        given = len(args)
        if not self._plain or given > self._positional:
            return self._bound(args, kwargs)
        if not kwargs and given == len(self._names):
            return dict(zip(self._names, args, strict=True))
        arguments: dict[str, Any] = {}
        named = 0
        for index, name in enumerate(self._names):
            if index < given:
                if name in kwargs:
                    return self._bound(args, kwargs)  # given twice: bind() says so
                arguments[name] = args[index]
            elif name in kwargs:
                arguments[name] = kwargs[name]
                named += 1
            elif (default := self._defaults[index]) is not _EMPTY:
                arguments[name] = default
            else:
                return self._bound(args, kwargs)  # missing: bind() says so
        if named != len(kwargs):
            return self._bound(args, kwargs)  # one it does not take: bind() says so
        return arguments

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments


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

    __slots__ = ("_call", "_name", "_steps", "_subject", "option")

    def __init__(
        self, selector: Selector, signature: inspect.Signature, option: str, owner: str
    ) -> None:
        self.option = option
        self._subject = f"this call's {option}"
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
        if (
            type(value) is str
            and 0 < len(value) <= MAX_KEY_LENGTH
            and value.isascii()
            and value.isprintable()
        ):
            return value  # most keys: validate_key's answer, without its call
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
        return validate_key(value, subject=self._subject)


class Fingerprinter:
    """The fingerprint of a call: its name and its bound arguments, minus the excluded."""

    __slots__ = ("_current", "_dropped", "_exclude", "_previous", "_whole")

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
        current, previous = secrets
        self._current = Hasher("CALL", name, "application/json", secret=current)
        self._previous = (
            None if previous is None else Hasher("CALL", name, "application/json", secret=previous)
        )
        # Whole arguments are dropped before they are converted (a session or a
        # logger has no JSON form); dotted paths are cut from the JSON.
        self._dropped = frozenset(p for p in paths if "." not in p) | _IMPLICIT
        self._exclude = tuple(p.split(".") for p in paths if "." in p)
        # Nothing to leave out of this function's arguments: the bound arguments are
        # written as they are when they are all JSON scalars (most calls).
        self._whole = self._dropped.isdisjoint(signature.parameters) and not self._exclude

    def of(self, arguments: Mapping[str, Any]) -> tuple[str, str | None]:
        """The call's fingerprint, and while secrets rotate its fingerprint under the
        previous secret (None otherwise)."""
        canonical = self._canonical(arguments)
        previous = self._previous
        return self._current(canonical), None if previous is None else previous(canonical)

    def _canonical(self, arguments: Mapping[str, Any]) -> bytes:
        if self._whole:
            for value in arguments.values():
                if type(value) not in _SCALAR_TYPES:
                    break
            else:
                try:
                    return _CANONICAL(arguments).encode("utf-8", "surrogatepass")
                except ValueError:
                    pass  # NaN or infinity: refused below, naming the argument
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
            _cut(data, path)
        # The canonical form is written here, from Python values (sorted keys, no
        # whitespace), and framed as every fingerprint is: no JSON text to parse back.
        return _CANONICAL(data).encode("utf-8", "surrogatepass")


def _cut(value: Any, path: list[str]) -> None:
    """Remove the dotted ``path`` from the JSON ``value``, if it is there."""
    for step in path[:-1]:
        if not isinstance(value, dict):
            return
        value = value.get(step)
    if isinstance(value, dict):
        value.pop(path[-1], None)
