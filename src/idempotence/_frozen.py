"""A cheaper ``__init__`` for the frozen, slotted dataclasses a request makes.

``dataclass(frozen=True)`` writes an ``__init__`` that sets each field with
``object.__setattr__(self, name, value)``, the way round its own ``__setattr__``, which
refuses. That call goes through a wrapper descriptor that copies its arguments into a
new tuple and looks the field up on the type again: about twice what setting the slot
costs, and a guarded request builds about 80 such fields (its claim's record alone has
19). :func:`quick_init` gives the class an ``__init__`` that calls each slot's own
descriptor instead: the same signature, the same defaults and default factories, the
same instances (still frozen, hashable and compared by value), for half the cost.

>>> from dataclasses import dataclass, field
>>> @quick_init
... @dataclass(frozen=True, slots=True)
... class Point:
...     x: int
...     y: int = 0
...     tags: list[str] = field(default_factory=list)
>>> Point(1), Point(1, 2, ["a"]) == Point(x=1, y=2, tags=["a"])
(Point(x=1, y=0, tags=[]), True)
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar, cast

__all__ = ["quick_init"]

T = TypeVar("T")

#: A default factory's field left out of the call.
_MISSING: Any = object()
#: Every class given a quick ``__init__`` (its tests compare each with dataclasses').
QUICK: list[type[Any]] = []


def quick_init(cls: type[T]) -> type[T]:
    """Replace frozen slotted dataclass ``cls``'s ``__init__`` (see the module)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a dataclass(frozen=True, slots=True)")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__, which quick_init does not call")
    namespace: dict[str, Any] = {"_MISSING": _MISSING}
    positional: list[str] = []
    keywords: list[str] = []
    body: list[str] = []
    for spec in dataclasses.fields(cast(Any, cls)):
        name = spec.name
        # The slot's own descriptor sets it, past the class's refusing __setattr__.
        namespace[f"_set_{name}"] = cls.__dict__[name].__set__
        if spec.default is not dataclasses.MISSING:
            namespace[f"_default_{name}"] = spec.default
            value, parameter = name, f"{name}=_default_{name}"
        elif spec.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{name}"] = spec.default_factory
            value = f"_factory_{name}() if {name} is _MISSING else {name}"
            parameter = f"{name}=_MISSING"
        else:
            value, parameter = name, name
        if not spec.init:
            # Not a parameter: always its default (dataclasses refuses one without).
            value = f"_default_{name}" if spec.default is not dataclasses.MISSING else ""
            value = value or f"_factory_{name}()"
        else:
            (keywords if spec.kw_only else positional).append(parameter)
        body.append(f"    _set_{name}(self, {value})")
    signature = ", ".join(["self", *positional, *(["*", *keywords] if keywords else [])])
    source = f"def __init__({signature}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    type.__setattr__(cls, "__init__", init)
    QUICK.append(cls)
    return cls
