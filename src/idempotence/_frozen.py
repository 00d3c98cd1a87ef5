"""A cheaper ``__init__`` for the frozen, slotted dataclasses a request makes.

``dataclass(frozen=True)`` writes an ``__init__`` that sets each field with
``object.__setattr__(self, name, value)``, the way round its own ``__setattr__``, which
refuses. That call goes through a wrapper descriptor that copies its arguments into a
new tuple and looks the field up on the type again: about twice what setting the slot
costs, and a guarded request builds about 80 such fields (its claim's record alone has
19). `quick_init` gives the class an ``__init__`` that calls each slot's own
descriptor instead: the same signature, the same defaults and default factories, the
same instances (still frozen, hashable and compared by value), for half the cost.

```python
from dataclasses import dataclass, field
@quick_init
@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int = 0
    tags: list[str] = field(default_factory=list)
Point(1), Point(1, 2, ["a"]) == Point(x=1, y=2, tags=["a"])
# (Point(x=1, y=0, tags=[]), True)
```
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["quick_init", "quick_new"]

T = TypeVar("T")

_MISSING: Any = object()
"""A default factory's field left out of the call."""
SOURCE = "<quick_init>"
"""The file name of every quick ``__init__`` (its tests find the classes by it)."""


def quick_init(cls: type[T]) -> type[T]:
    """Replace frozen slotted dataclass ``cls``'s ``__init__`` (see the module)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a dataclass(frozen=True, slots=True)")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__, which quick_init does not call")
    # Handed to the __init__ as closure variables, as dataclasses does.
    helpers: dict[str, Any] = {"_MISSING": _MISSING}
    positional: list[str] = []
    keywords: list[str] = []
    body: list[str] = []
    annotations: dict[str, Any] = {}
    for spec in dataclasses.fields(cast(Any, cls)):
        name = spec.name
        helpers[f"_set_{name}"] = _slot(cls, name).__set__  # past the refusing __setattr__
        has_default = spec.default is not dataclasses.MISSING
        has_factory = spec.default_factory is not dataclasses.MISSING
        if has_default:
            helpers[f"_default_{name}"] = spec.default
        if has_factory:
            helpers[f"_factory_{name}"] = spec.default_factory
        if not spec.init:
            # Not a parameter: its default, or (as dataclasses does) left unset.
            if has_default or has_factory:
                value = f"_default_{name}" if has_default else f"_factory_{name}()"
                body.append(f"    _set_{name}(self, {value})")
            continue
        annotations[name] = spec.type
        if has_default:
            parameter, value = f"{name}=_default_{name}", name
        elif has_factory:
            parameter = f"{name}=_MISSING"
            value = f"_factory_{name}() if {name} is _MISSING else {name}"
        else:
            parameter, value = name, name
        (keywords if spec.kw_only else positional).append(parameter)
        body.append(f"    _set_{name}(self, {value})")
    signature = ", ".join(["self", *positional, *(["*", *keywords] if keywords else [])])
    source = (
        f"def __create__({', '.join(helpers)}):\n"
        f"  def __init__({signature}):\n"
        + ("\n".join("  " + line for line in body) or "    pass")
        + "\n  return __init__\n"
    )
    namespace: dict[str, Any] = {}
    # The class's module as the globals: get_type_hints resolves the annotations there.
    module = sys.modules.get(cls.__module__)
    exec(compile(source, SOURCE, "exec"), vars(module) if module else {}, namespace)
    init = namespace["__create__"](**helpers)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = {**annotations, "return": None}
    init.__doc__ = cls.__init__.__doc__
    type.__setattr__(cls, "__init__", init)
    return cls


def quick_new(cls: type[T]) -> Callable[..., T]:
    """A maker of frozen slotted dataclass ``cls``'s instances from every field's
    value, positional, in the fields' order (no defaults, no keywords), for the few
    places that build one per request from a database's reply, at about a quarter of
    ``cls(...)``'s cost.

    Calling a class runs ``type.__call__``, ``__new__`` and ``__init__``, and a frozen
    field is set past the class's refusing ``__setattr__``, a call per field. The
    maker fills a twin of ``cls`` instead (its slots, the same layout, no
    ``__setattr__`` of its own: a field is one slot store) and then makes the object a
    ``cls`` by assigning ``__class__``, which Python allows between classes of the
    same layout. The instance is the one ``cls(...)`` builds: frozen, hashable,
    compared by value.

    ```python
    from dataclasses import dataclass
    @dataclass(frozen=True, slots=True)
    class Point:
        x: int
        y: int
    quick_new(Point)(1, 2) == Point(1, 2)
    # True
    ```
    """
    params = getattr(cls, "__dataclass_params__", None)
    slots = cls.__dict__.get("__slots__")
    if params is None or not params.frozen or slots is None or cls.__bases__ != (object,):
        raise TypeError(f"{cls.__name__} is not a dataclass(frozen=True, slots=True) of its own")
    names = [spec.name for spec in dataclasses.fields(cast(Any, cls))]
    if not all(spec.init for spec in dataclasses.fields(cast(Any, cls))):
        raise TypeError(f"{cls.__name__} has a field that its __init__ does not take")
    twin = type(f"_{cls.__name__}Twin", (), {"__slots__": slots, "__module__": cls.__module__})
    source = (
        "def __create__(_new, _twin, _cls):\n"
        f"  def make({', '.join(names)}):\n"
        "    self = _new(_twin)\n"
        + "".join(f"    self.{name} = {name}\n" for name in names)
        + "    self.__class__ = _cls\n"
        "    return self\n"
        "  return make\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, SOURCE, "exec"), {}, namespace)
    make: Callable[..., T] = namespace["__create__"](object.__new__, twin, cls)
    make.__qualname__ = f"quick_new({cls.__qualname__})"
    return make


def _slot(cls: type[Any], name: str) -> Any:
    """The member descriptor of slot ``name`` (the class's own, or a base's)."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name)
        if found is not None:
            if isinstance(found, types.MemberDescriptorType):
                return found
            break
    raise TypeError(f"{cls.__name__}.{name} is not a slot")
