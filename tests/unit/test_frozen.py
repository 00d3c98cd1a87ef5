"""quick_init: a frozen slotted dataclass's cheaper ``__init__`` builds the same
instances as the one dataclasses writes, with the same signature and errors."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from dataclasses import dataclass, field
from typing import Any

import pytest

import idempotence.flows  # the modules whose classes are checked
import idempotence.http
import idempotence.states
from idempotence._frozen import SOURCE, quick_init, quick_new


def twins() -> tuple[type[Any], type[Any]]:
    def make() -> type[Any]:
        @dataclass(frozen=True, slots=True)
        class Sample:
            a: int
            b: str = "b"
            c: list[int] = field(default_factory=list)
            d: int = field(default=4, init=False)
            e: tuple[int, ...] = field(default=(), kw_only=True)
            f: int = field(kw_only=True, default=0)

        return Sample

    return make(), quick_init(make())


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1,), {}), ((1, "x"), {}), ((1, "x", [2]), {"e": (3,)}), ((), {"a": 1, "f": 9})],
)
def test_the_same_instances_as_the_dataclass_init(args: tuple[Any, ...], kwargs: Any) -> None:
    plain, quick = twins()
    ours, theirs = quick(*args, **kwargs), plain(*args, **kwargs)
    assert repr(ours).split("(", 1)[1] == repr(theirs).split("(", 1)[1]
    assert dataclasses.astuple(ours) == dataclasses.astuple(theirs)


def test_each_instance_gets_its_own_default_from_the_factory() -> None:
    _, quick = twins()
    one, two = quick(1), quick(1)
    assert one.c == [] and one.c is not two.c


def test_still_frozen_and_the_same_errors_for_bad_calls() -> None:
    plain, quick = twins()
    made = quick(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.a = 2
    response = idempotence.states.StoredResponse(201, (("a", "b"),), b"x")
    assert hash(response) == hash(idempotence.states.StoredResponse(201, (("a", "b"),), b"x"))
    for call in (lambda cls: cls(), lambda cls: cls(1, d=5), lambda cls: cls(1, "b", [], 3)):
        with pytest.raises(TypeError):
            call(plain)
        with pytest.raises(TypeError):
            call(quick)


def test_a_field_out_of_init_without_a_default_is_left_unset_as_dataclasses_does() -> None:
    def make() -> type[Any]:
        @dataclass(frozen=True, slots=True)
        class Later:
            a: int
            b: int = field(init=False)

        return Later

    for made in (make()(1), quick_init(make())(1)):
        assert made.a == 1
        with pytest.raises(AttributeError):
            _ = made.b


def test_fields_of_a_base_class_are_set_too() -> None:
    @dataclass(frozen=True, slots=True)
    class Base:
        a: int

    @quick_init
    @dataclass(frozen=True, slots=True)
    class Derived(Base):
        b: int = 2

    assert (Derived(1).a, Derived(1).b) == (1, 2)


def test_refuses_a_class_it_would_get_wrong() -> None:
    @dataclass(slots=True)
    class Thawed:
        a: int

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (Thawed, Checked):
        with pytest.raises(TypeError):
            quick_init(cls)


def test_quick_new_makes_the_instance_the_class_makes() -> None:
    """quick_new's maker (a twin's slots filled, then its __class__ set) builds an
    instance equal to the class's own, of that very class, frozen, hashable, and
    copied and pickled as any."""
    import copy
    import pickle
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    values = (7, "s", "k", "POST", "/p", "fp", {"a": 1}, "http", "started", 2, now)
    values += (timedelta(seconds=3), None, None, now, now, None, None, "call")
    KeyRecord = idempotence.states.KeyRecord
    made, built = quick_new(KeyRecord)(*values), KeyRecord(*values)
    assert type(made) is KeyRecord
    assert made == built and hash(made.lock_timeout) == hash(built.lock_timeout)
    assert dataclasses.astuple(made) == dataclasses.astuple(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.key = "other"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(made)) == made == copy.copy(made)
    assert dataclasses.replace(made, key="k2").key == "k2"
    lease = quick_new(idempotence.states.Lease)(1, "s", "k", 2, "started", None)
    assert hash(lease) == hash(idempotence.states.Lease(1, "s", "k", 2, "started"))


def test_the_engines_makers_take_the_fields_in_the_order_their_callers_pass() -> None:
    """The engine, the handler step and the functions guard build these per call from
    positional values (quick_new takes no keywords): a field added, dropped or moved
    (FlowResult's two booleans swapped, say) must break here, not silently store or
    answer the wrong thing."""
    from idempotence.flows import effects, results

    states = idempotence.states
    makers = [
        (results.new_result, results.FlowResult, "kind claim response stored error answered"),
        (results.new_captured, results.Captured, "status headers body overflowed"),
        (states.new_response, states.StoredResponse, "status headers body"),
        (effects.new_do_claim, effects.DoClaim, "request"),
        (effects.new_do_handle, effects.DoHandle, "app lease limit on_overflow beat_every"),
        (effects.new_do_finish, effects.DoFinish, "lease response error"),
    ]
    for maker, cls, order in makers:
        names = tuple(order.split())
        assert tuple(spec.name for spec in dataclasses.fields(cls)) == names, cls
        values = [object() for _ in names]
        made = maker(*values)
        assert type(made) is cls
        assert made == cls(**dict(zip(names, values, strict=True)))


def test_quick_new_refuses_a_class_it_would_get_wrong() -> None:
    @dataclass(slots=True)
    class Thawed:
        a: int

    @dataclass(frozen=True)
    class Unslotted:
        a: int

    @dataclass(frozen=True, slots=True)
    class Base:
        a: int

    @dataclass(frozen=True, slots=True)
    class Derived(Base):
        b: int

    @dataclass(frozen=True, slots=True)
    class Later:
        a: int
        b: int = field(init=False, default=0)

    for cls in (Thawed, Unslotted, Derived, Later):
        with pytest.raises(TypeError):
            quick_new(cls)


def _reference(cls: type[Any]) -> inspect.Signature:
    """The signature dataclasses would give ``cls``'s fields."""
    specs = [
        (
            f.name,
            f.type,
            field(  # type: ignore[call-overload]
                default=f.default, default_factory=f.default_factory, init=f.init, kw_only=f.kw_only
            ),
        )
        for f in dataclasses.fields(cls)
    ]
    return inspect.signature(dataclasses.make_dataclass(cls.__name__, specs, frozen=True))


def _shape(signature: inspect.Signature) -> list[tuple[str, Any, Any, bool]]:
    return [
        (p.name, p.kind, p.annotation, p.default is inspect.Parameter.empty)
        for p in signature.parameters.values()
    ]


def _quick_classes() -> list[type[Any]]:
    modules = [idempotence.states, idempotence.flows, idempotence.http]
    modules += [
        module
        for name, module in sorted(sys.modules.items())
        if name.startswith(("idempotence.flows.", "idempotence.http."))
    ]
    found = {
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type)
        and getattr(getattr(value.__init__, "__code__", None), "co_filename", None) == SOURCE
    }
    return sorted(found, key=lambda cls: cls.__qualname__)


def test_every_library_class_keeps_the_dataclass_signature() -> None:
    classes = _quick_classes()
    assert len(classes) >= 20  # the records, effects and results a request builds
    for cls in classes:
        ours, reference = inspect.signature(cls), _reference(cls)
        assert _shape(ours) == _shape(reference), cls
        if cls.__module__ == "idempotence.states":  # no names imported for typing alone
            assert typing.get_type_hints(cls.__init__)  # its annotations resolve
        for name, parameter in reference.parameters.items():
            default = parameter.default
            if default is not inspect.Parameter.empty and repr(default) != "<factory>":
                assert ours.parameters[name].default == default, (cls, name)
