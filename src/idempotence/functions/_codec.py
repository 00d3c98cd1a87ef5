"""Return values as stored JSON, and back to their declared type (DESIGN 12).

A guarded function's return value is its stored response. `codec_for` reads the
function's declared return type once, at decoration, and builds a `Codec`:
``dump`` turns a value into JSON, ``load`` turns the stored JSON back into the declared
type. Supported without configuration:

* JSON values: ``str``, ``int``, ``float``, ``bool``, ``None``, ``list[T]``,
  ``tuple[T, ...]``, ``dict[str, T]``, ``Any`` (or no annotation: any JSON value),
  ``X | None``, and ``Enum`` members (stored by value);
* dataclasses, field by field, nested ones included;
* pydantic models (``model_dump(mode="json")`` / ``model_validate``), when pydantic is
  installed.

Anything else needs a serializer pair (``serializer=(dump, load)``); without one, the
decorator refuses the function when it is decorated, naming the type. A value that
still cannot be stored (a ``dict`` holding a socket under an ``Any``, a str holding a
lone surrogate, which UTF-8 cannot write) fails at the first call, before anything is
stored, so a replay can never meet what it cannot restore: the value is dumped and
loaded back, unless its type is made of JSON values only (``plain``), whose stored form
loads back by construction.

The same conversion (by the value's own type) makes the arguments' JSON for the
fingerprint: `to_json`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import inspect
import json
import sys
import types
import typing
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Union

from .._json import writer
from ..errors import ConfigurationError

__all__ = ["Codec", "NotStorable", "codec_for", "to_json"]

_JSON_SCALARS = (str, int, float, bool)
_FLOAT_MAX = int(sys.float_info.max)
_FLOAT_MIN = -_FLOAT_MAX


class NotStorable(TypeError):
    """A value that cannot be written as JSON, or read back as its declared type."""


_WRITE = writer(ensure_ascii=False, allow_nan=False, compact=True)


@dataclasses.dataclass(frozen=True, slots=True)
class Codec:
    """How one declared type is stored: ``dump`` to a JSON value, ``load`` back.
    ``plain``: the type is made of JSON values only (no dataclass, model, enum or
    serializer), so what ``dump`` accepted loads back as it was, and `encode` does
    not read it back to be sure."""

    type_name: str
    dump: Callable[[Any], Any]
    load: Callable[[Any], Any]
    plain: bool = False

    def encode(self, value: Any) -> bytes:
        """``value`` as stored JSON bytes; `NotStorable` when it cannot be, or
        when what was stored would not load back (checked now, not at the replay)."""
        try:
            body = _WRITE(self.dump(value)).encode()
        except NotStorable:
            raise
        except UnicodeEncodeError as exc:  # the only text UTF-8 refuses: surrogates
            raise NotStorable(
                f"the {type(value).__name__} holds {exc.object[exc.start : exc.end]!r}, a "
                "lone surrogate (half of a UTF-16 pair, not a character), which UTF-8 "
                "cannot store"
            ) from None
        except (TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise NotStorable(
                f"{type(value).__name__} value cannot be written as JSON: {exc}"
            ) from None
        if self.plain:
            return body
        try:
            self.load(json.loads(body))
        except Exception as exc:
            raise NotStorable(
                f"the stored form of this {type(value).__name__} does not read back as "
                f"{self.type_name}: {exc}"
            ) from None
        return body

    def decode(self, body: bytes) -> Any:
        return self.load(json.loads(body))


def codec_for(
    annotation: Any, serializer: tuple[Callable[[Any], Any], Callable[[Any], Any]] | None
) -> Codec:
    """The codec of a function declared to return ``annotation``
    (``inspect.Signature.empty`` or ``Any`` for none); ``serializer`` overrides it.
    [`ConfigurationError`][idempotence.errors.ConfigurationError] when the
    type cannot be stored and no serializer is given."""
    if serializer is not None:
        dump, load = _pair(serializer)
        return Codec(_name(annotation), dump, load)
    try:
        dump, load = _converters(annotation)
    except NotStorable as exc:
        raise ConfigurationError(
            f"the return type {_name(annotation)} cannot be stored for replay ({exc}): "
            "return JSON values, dataclasses or pydantic models, or pass "
            "serializer=(dump, load) with functions to and from a JSON value"
        ) from None
    return Codec(_name(annotation), dump, load, plain=_plain(annotation))


def _plain(tp: Any) -> bool:
    """Whether declared type ``tp`` is made of JSON values only: then what its dump
    accepts is JSON that its load takes back as it was (see `_converters`)."""
    if tp is _EMPTY or tp is Any or tp is object or tp is None or tp is type(None):
        return True
    if tp in _JSON_SCALARS or tp in (list, tuple, dict):
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _plain(typing.get_args(tp)[0])
    if origin in (list, tuple, dict, Union, types.UnionType):
        return all(arg is Ellipsis or _plain(arg) for arg in typing.get_args(tp))
    return False


def _pair(serializer: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    if (
        not isinstance(serializer, tuple)
        or len(serializer) != 2
        or not all(callable(part) for part in serializer)
    ):
        raise ConfigurationError(
            f"serializer={serializer!r} must be a pair of functions (dump, load): "
            "dump(value) returns a JSON value, load(json_value) the value again"
        )
    return serializer[0], serializer[1]


def _name(annotation: Any) -> str:
    if annotation is _EMPTY:
        return "Any"
    return getattr(annotation, "__qualname__", None) or repr(annotation)


_EMPTY: Any = inspect.Signature.empty
"""What `codec_for` is given for a function without a return annotation."""


def _identity(value: Any) -> Any:
    return value


def _json_value(value: Any) -> Any:
    """A value declared ``Any``: JSON as it is, and refused otherwise (a tuple would
    come back a list, a set not at all)."""
    if type(value) not in _SCALAR_TYPES:
        _check_json(value)
    return value


_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})
"""The JSON scalars, by exact type (a subclass, such as an enum, would come back as its
base): checked in line, a call saved per item."""


def _check_json(value: Any) -> None:
    kind = type(value)
    if kind in _SCALAR_TYPES:
        return
    if kind is list:
        for item in value:
            if type(item) not in _SCALAR_TYPES:
                _check_json(item)
        return
    if kind is dict:
        _check_items(value)
        return
    raise NotStorable(
        f"a {type(value).__name__} is not a JSON value (declare the return type to "
        "store dataclasses or models)"
    )


def _check_items(value: dict[Any, Any]) -> None:
    for name, item in value.items():
        if type(name) is not str:
            raise NotStorable(f"a dict key {name!r} is not a str")
        if type(item) not in _SCALAR_TYPES:
            _check_json(item)


def _converters(tp: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """(dump, load) for declared type ``tp``; `NotStorable` if there are none."""
    if tp is _EMPTY or tp is Any or tp is object:
        return _json_value, _identity
    if tp is None or tp is type(None):
        return _none, _none
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _converters(args[0])
    if origin is Union or origin is types.UnionType:
        return _union(tp, args)
    if origin in (list, tuple, dict) or tp in (list, tuple, dict):
        return _container(tp, origin or tp, args)
    if tp in _JSON_SCALARS:
        return _scalar(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return (lambda value: _instance(value, tp).value), tp
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass(tp)
    if isinstance(tp, type) and _is_pydantic(tp):
        model: Any = tp
        return (lambda value: _instance(value, tp).model_dump(mode="json")), model.model_validate
    raise NotStorable(f"{_name(tp)} is neither JSON, a dataclass nor a pydantic model")


def _instance(value: Any, tp: type) -> Any:
    if not isinstance(value, tp):
        raise NotStorable(
            f"a {type(value).__name__} was returned where {tp.__qualname__} is declared"
        )
    return value


def _none(value: Any) -> None:
    if value is not None:
        raise NotStorable(f"a {type(value).__name__} was returned where None is declared")
    return None


def _scalar(tp: type) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    def dump(value: Any) -> Any:
        # bool is an int, and an int is a float by PEP 484: accept what the type does.
        if isinstance(value, tp) or (tp is float and type(value) is int):
            if tp is not bool and type(value) is bool:
                raise NotStorable(f"a bool was returned where {tp.__name__} is declared")
            if tp is float and type(value) is int and not _FLOAT_MIN <= value <= _FLOAT_MAX:
                raise NotStorable(
                    "an int too large for a float was returned where float is declared"
                )
            return value
        raise NotStorable(f"a {type(value).__name__} was returned where {tp.__name__} is declared")

    def load(data: Any) -> Any:
        return float(data) if tp is float else data

    return dump, load


def _union(tp: Any, members: tuple[Any, ...]) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    others = [member for member in members if member is not type(None)]
    if len(others) != 1:
        raise NotStorable(
            f"{tp!r} is a union of several types, which a stored value cannot tell apart"
        )
    dump, load = _converters(others[0])
    return (
        (lambda value: None if value is None else dump(value)),
        (lambda data: None if data is None else load(data)),
    )


def _container(
    tp: Any, origin: Any, args: tuple[Any, ...]
) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    if origin is dict:
        if args and args[0] is not str:
            raise NotStorable(f"{tp!r}: JSON object keys are str")
        dump, load = _converters(args[1] if args else Any)
        if dump is _json_value:  # dict[str, Any]: checked, written as it is

            def check_dict(value: Any) -> Any:
                _check_items(_instance(value, dict))
                return value

            return check_dict, _identity

        def dump_dict(value: Any) -> Any:
            value = _instance(value, dict)
            for name in value:
                if type(name) is not str:
                    raise NotStorable(f"a dict key {name!r} is not a str")
            return {name: dump(item) for name, item in value.items()}

        return dump_dict, lambda data: {name: load(item) for name, item in data.items()}
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        parts = [_converters(arg) for arg in args]

        def dump_fixed(value: Any) -> Any:
            value = _instance(value, tuple)
            if len(value) != len(parts):
                raise NotStorable(f"a tuple of {len(value)} was returned where {tp!r} is declared")
            return [dump(item) for (dump, _), item in zip(parts, value, strict=True)]

        return dump_fixed, lambda data: tuple(
            load(item) for (_, load), item in zip(parts, data, strict=True)
        )
    dump_item, load_item = _converters(args[0] if args else Any)
    kind = tuple if origin is tuple else list
    return (
        lambda value: [dump_item(item) for item in _instance(value, kind)],
        lambda data: kind(load_item(item) for item in data),
    )


def _dataclass(tp: type) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    try:
        hints = typing.get_type_hints(tp)
    except Exception as exc:
        raise NotStorable(f"the fields of {tp.__qualname__} cannot be read: {exc}") from None
    fields = [field for field in dataclasses.fields(tp) if field.init]
    if any(not field.init for field in dataclasses.fields(tp)):
        raise NotStorable(
            f"{tp.__qualname__} has fields outside __init__, which cannot be restored"
        )
    converters = {field.name: _converters(hints.get(field.name, Any)) for field in fields}

    def dump(value: Any) -> Any:
        value = _instance(value, tp)
        return {name: pair[0](getattr(value, name)) for name, pair in converters.items()}

    def load(data: Any) -> Any:
        return tp(**{name: pair[1](data[name]) for name, pair in converters.items()})

    return dump, load


def _is_pydantic(tp: type) -> bool:
    # Looked up by its methods, so pydantic is imported only by those who use it.
    return callable(getattr(tp, "model_validate", None)) and callable(
        getattr(tp, "model_dump", None)
    )


# -- the arguments, for the fingerprint --------------------------------------------------------


def to_json(value: Any) -> Any:
    """``value`` (an argument) as a JSON value, by its own type: JSON values as they
    are, tuples and sets as lists, dataclasses and pydantic models as objects, enums by
    value, dates and times, UUIDs and decimals as text. `NotStorable` for
    anything else."""
    if value is None or type(value) in (str, int, bool):
        return value
    if type(value) is float:
        if value != value or value in (float("inf"), float("-inf")):
            raise NotStorable(f"{value!r} is not a JSON number")
        return value
    if isinstance(value, dict):
        return {_json_key(name): to_json(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    if isinstance(value, set | frozenset):
        return sorted((to_json(item) for item in value), key=_sort_key)
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: to_json(getattr(value, field.name)) for field in dataclasses.fields(value)
        }
    if _is_pydantic(type(value)):
        return value.model_dump(mode="json")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    if isinstance(value, str | int | float):  # subclasses of the scalars
        return to_json(type(value).__mro__[-2](value))
    raise NotStorable(f"a {type(value).__name__} has no JSON form")


def _json_key(name: Any) -> str:
    if isinstance(name, str):
        return name
    if isinstance(name, int | float | bool | enum.Enum | uuid.UUID):
        return str(to_json(name))
    raise NotStorable(f"a dict key of type {type(name).__name__} has no JSON form")


def _sort_key(item: Any) -> str:
    return json.dumps(item, sort_keys=True)
