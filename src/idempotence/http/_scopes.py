"""Scope callables: how a request names its tenant, whose keys are its own (DESIGN 2).

[`Idempotency`][idempotence.http.wsgi.Idempotency] needs one (``scope=``), and a
[`Policy`][idempotence.http.Policy] may override it for an endpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeAlias

from ..errors import ConfigurationError
from ._request import RequestInfo

__all__ = ["ScopeFn", "header_scope", "single_tenant"]

ScopeFn: TypeAlias = Callable[[RequestInfo], "str | Awaitable[str | None] | None"]
"""A request to its tenant id; None when the request has none (answered 401). In an
ASGI app it may be a coroutine function."""


class SingleTenant:
    """A scope that puts every request in one tenant: the explicit opt-in (what
    `single_tenant` makes; the lifecycle reads its ``tenant`` without calling it)."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant

    def __call__(self, request: RequestInfo) -> str:
        return self.tenant

    def __repr__(self) -> str:
        return f"single_tenant({self.tenant!r})"


def single_tenant(tenant: str = "default") -> ScopeFn:
    """Declare that the app has one tenant, so keys are unique across all clients.

    There is no implicit global scope: an app that serves several accounts must
    pass a callable that finds the account, or one client could replay another's
    response by guessing its key.

    ```python
    single_tenant("shop")(RequestInfo("POST", "/orders"))
    # 'shop'
    ```
    """
    if not tenant:
        raise ConfigurationError("single_tenant() needs a non-empty tenant name")
    return SingleTenant(tenant)


def header_scope(name: str) -> ScopeFn:
    """A scope read from request header ``name``.

    Only behind a gateway that authenticates the caller and sets the header itself:
    a header the client controls is no tenant boundary.

    ```python
    header_scope("x-account-id")(RequestInfo("POST", "/", headers=(("x-account-id", "a1"),)))
    # 'a1'
    ```
    """

    def scope(request: RequestInfo) -> str | None:
        return request.header(name) or None

    return scope
