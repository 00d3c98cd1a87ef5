"""What a guarded handler can reach while it runs: the key's lease and, in
request-as-transaction mode (F3), the open transaction.

Context variables, so they follow the request into the handler on its task (ASGI)
or thread (WSGI), and into the thread pool that runs a sync endpoint of an ASGI
framework (Starlette and FastAPI copy the context there).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from ..errors import ConfigurationError
from ..states import Lease
from ..stores import AsyncTransaction, Transaction

__all__ = ["current_async_transaction", "current_lease", "current_transaction"]

_running: ContextVar[tuple[Any, Lease | None]] = ContextVar(
    "idempotence_http_running", default=(None, None)
)
"""The running handler's transaction (or None) and lease: one variable, not two, so
that a guarded request sets and resets one."""


def current_transaction() -> Transaction:
    """The transaction of the request-as-transaction endpoint running now (F3), on a
    sync store (WSGI, Django). Write in it, and the writes commit together with the
    claim and the stored response, or not at all.

    ```python
    @app.post("/v1/transfers")
    def transfer():
        current_transaction().execute("INSERT INTO transfers ...")
        return {"ok": True}, 201
    ```
    """
    tx = _running.get()[0]
    if not isinstance(tx, Transaction):
        raise _outside("current_transaction", tx, "current_async_transaction")
    return tx


def current_async_transaction() -> AsyncTransaction:
    """The async twin of [`current_transaction`][idempotence.http.current_transaction],
    for ASGI apps on an async store. In FastAPI it is a dependency as it is: ``tx =
    Depends(current_async_transaction)``.

    ```python
    async def transfer(request):
        await current_async_transaction().execute("INSERT INTO transfers ...")
    ```
    """
    tx = _running.get()[0]
    if not isinstance(tx, AsyncTransaction):
        raise _outside("current_async_transaction", tx, "current_transaction")
    return tx


def current_lease() -> Lease:
    """The lease of the key the running handler holds: its row ``id`` names foreign
    calls' derived keys (R4), e.g. ``f"charge-{current_lease().id}"``."""
    lease = _running.get()[1]
    if lease is None:
        raise ConfigurationError(
            "current_lease() is only available inside a handler guarded by the "
            "idempotence middleware, while it runs with a claimed key"
        )
    return lease


def _outside(name: str, tx: Any, other: str) -> ConfigurationError:
    if tx is not None:
        return ConfigurationError(f"{name}() found an async/sync mismatch: call {other}()")
    return ConfigurationError(
        f"{name}() is only available inside a handler of an endpoint guarded with "
        "Policy(transaction=True), while the request runs"
    )


class bound:
    """Make ``tx`` and ``lease`` current for the app's run (a class, not a
    ``@contextmanager``: it is entered once per guarded request)."""

    __slots__ = ("_running", "_token")

    def __init__(self, tx: Transaction | AsyncTransaction | None, lease: Lease) -> None:
        self._running = (tx, lease)

    def __enter__(self) -> None:
        self._token = _running.set(self._running)

    def __exit__(self, *exc_info: object) -> None:
        _running.reset(self._token)
