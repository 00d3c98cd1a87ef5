"""The fixtures of a suite's test class: the store under test, behind a sync face when
it is async, its scope, its clock, and what its class declares."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import pytest

from ...stores.capabilities import Capability, capabilities_of
from .._blocking import Blocking, EventLoopThread
from ._support import AgeKey, AgeLock, Clock


def fixtures_for(
    store_type: type[Any],
    open_store: Callable[..., Any],
    age_lock: AgeLock | None,
    age_key: AgeKey | None,
    capabilities: frozenset[Capability],
) -> dict[str, Any]:
    """The fixtures, by name, for the class of ``store_type``'s suite, which tests
    ``capabilities``."""
    fixtures = list(inspect.signature(open_store).parameters)
    namespace: dict[str, Any] = {}

    def declares_what_is_tested(opened: Any) -> None:
        missing = capabilities - capabilities_of(opened)
        if missing:
            raise TypeError(
                f"the {store_type.__qualname__} that the function given to suite() opened "
                f"does not declare {', '.join(sorted(missing))}, which the suite tests: "
                "pass suite(capabilities=...) what the stores it opens declare"
            )

    def store(self: Any, **requested: Any) -> Iterator[Any]:
        """The store under test, behind a sync face when it is async."""
        opened = open_store(**{name: requested[name] for name in fixtures})
        if not isinstance(opened, store_type):
            raise TypeError(
                f"the function given to suite() opened a {type(opened).__qualname__}, "
                f"not a {store_type.__qualname__}"
            )
        if not inspect.iscoroutinefunction(opened.claim):
            try:
                declares_what_is_tested(opened)
                yield opened
            finally:
                opened.close()
            return
        loop = EventLoopThread()
        face = Blocking(opened, loop)
        try:
            declares_what_is_tested(face)
            yield face
        finally:
            try:
                face.close()
            finally:
                loop.close()

    def scope(self: Any) -> str:
        """A scope of this test's own."""
        return f"conformance-{uuid4().hex[:12]}"

    def clock(self: Any, store: Any) -> Clock:
        """Ages the test's locks and keys (``age_lock``, ``age_key``), or waits."""
        return Clock(store, age_lock, age_key)

    def declared(self: Any, store: Any) -> frozenset[Capability]:
        """What the store under test declares it can do."""
        return capabilities_of(store)

    # The opener's fixtures are the store fixture's own, so that pytest resolves them,
    # a parametrized one included, as for any fixture.
    store.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in fixtures]
    )
    namespace["store"] = pytest.fixture(store)
    namespace["scope"] = pytest.fixture(scope)
    namespace["clock"] = pytest.fixture(clock)
    namespace["declared"] = pytest.fixture(declared)
    return namespace
