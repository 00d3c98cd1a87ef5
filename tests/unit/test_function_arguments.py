"""A guarded call's arguments, bound by name without ``Signature.bind`` (DESIGN 12, P2).

`Binder` reads the parameters once and binds each call itself; whatever it
returns must be what ``signature.bind(*args, **kwargs)`` and ``apply_defaults()`` give
(the fingerprint and the key are read from it), and a call that does not fit must raise
the same `TypeError` that calling the function would, before anything is claimed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idempotence.functions._arguments import Binder


def plain(order_id: str, amount: int = 5, *, note: str | None = None) -> None: ...


def positional_only(order_id: str, /, amount: int = 5) -> None: ...


def variadic(order_id: str, *rest: int, **extra: Any) -> None: ...


def keyword_only(*, order_id: str, amount: int = 5) -> None: ...


def nothing() -> None: ...


class Shop:
    def charge(self, order_id: str, amount: int = 5) -> None: ...


FUNCTIONS: list[Callable[..., Any]] = [
    plain,
    positional_only,
    variadic,
    keyword_only,
    nothing,
    Shop.charge,
]
NAMES = ["order_id", "amount", "note", "rest", "extra", "self", "other"]


def _expected(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        return TypeError, str(exc)
    bound.apply_defaults()
    return list(bound.arguments.items())


def _bound(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        arguments = Binder(inspect.signature(fn)).bind(args, kwargs)
    except TypeError as exc:
        return TypeError, str(exc)
    return list(arguments.items())  # the order too: the parameters'


@given(
    fn=st.sampled_from(FUNCTIONS),
    args=st.lists(st.integers(0, 9), max_size=4).map(tuple),
    kwargs=st.dictionaries(st.sampled_from(NAMES), st.integers(0, 9), max_size=4),
)
def test_every_call_binds_as_signature_bind_does(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    assert _bound(fn, args, kwargs) == _expected(fn, args, kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "missing a required argument: 'order_id'"),
        (("a", 1, 2), {}, "too many positional arguments"),
        (("a",), {"order_id": "b"}, "multiple values for argument 'order_id'"),
        (("a",), {"amout": 1}, "got an unexpected keyword argument 'amout'"),
    ],
)
def test_a_call_that_does_not_fit_raises_what_calling_would(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        Binder(inspect.signature(plain)).bind(args, kwargs)


def test_defaults_are_applied_in_the_parameters_order() -> None:
    binder = Binder(inspect.signature(plain))
    assert list(binder.bind((), {"note": "n", "order_id": "a"}).items()) == [
        ("order_id", "a"),
        ("amount", 5),
        ("note", "n"),
    ]
    assert binder.bind(("a", 7), {}) == {"order_id": "a", "amount": 7, "note": None}
