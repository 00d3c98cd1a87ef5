"""The exception hierarchy.

Every error the library raises derives from
[`IdempotenceError`][idempotence.errors.IdempotenceError]. Each class's docstring is its
default message, so ``raise StoreUnavailable()`` already says what went wrong; pass a
message to say more. Driver errors are always wrapped with ``raise ... from exc`` so the
cause stays on the traceback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .states import StoredResponse


class IdempotenceError(Exception):
    """An idempotence error."""

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        self.message = message or (self.__doc__ or type(self).__name__).strip().splitlines()[0]
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)
        super().__init__(self.message)


# -- request errors: the client sent something we cannot accept (P7, P8) -------------


class RequestError(IdempotenceError):
    """The request cannot be accepted as sent."""

    status: int = 400
    """The HTTP status the integrations answer with."""


class MissingKey(RequestError):
    """This endpoint requires an Idempotency-Key header: send a unique one per operation."""


class InvalidKey(RequestError):
    """The Idempotency-Key is malformed: send 1 to 255 printable ASCII characters."""


class BodyTooLarge(RequestError):
    """The request body is larger than this endpoint accepts for idempotent requests."""

    status = 413


class InvalidBody(RequestError):
    """The request body cannot be read as the content type it declares."""


# -- store errors: the key store could not do what was asked ------------------------


class StoreError(IdempotenceError):
    """The key store failed."""


class StoreUnavailable(StoreError):
    """The key store cannot be reached; nothing was executed. Retry later (P11)."""


class AnswerNotStored(StoreUnavailable):
    """The request ran, but the key store could not store its answer, so the answer
    was not sent: retry with the same key to get it.

    The key stays locked while the answer is stored again in the background; once it
    is, a retry gets it replayed. If the store stays out of reach until the lock
    lapses, a retry runs the request again (an effect keyed by a key derived from the
    request's makes that second run harmless).
    """


class TransientError(StoreError):
    """The database aborted the transaction (serialization failure, deadlock, busy).

    The store retries operations whose transaction it owns; inside a caller's
    transaction the caller decides.
    """


class SchemaMissing(StoreError):
    """The key store's tables are missing: run `idempotence migrate --database URL`."""


class LockLost(StoreError):
    """This worker no longer holds the key's lock: another worker took it over (F1).

    The fenced write was refused and the transaction it ran in must roll back.
    """


class KeyNotFound(StoreError):
    """No idempotency key with this scope and key exists."""


class KeyIsLocked(IdempotenceError):
    """A worker holds this key's lock right now; evicting it needs --force."""


class ConfigurationError(IdempotenceError):
    """The library is configured in a way that cannot work."""


class StoreMisconfigured(StoreUnavailable, ConfigurationError):
    """The key store's server refuses the store's configuration: fix the database URL.

    A Redis database number the server does not have, or a ``redis+cluster://`` URL for
    a server that is not in cluster mode: nothing was executed, as when the store is
    unavailable (the HTTP middleware answers 503 and never runs the request, even where
    ``fail_open`` would), but no retry cures it, so it is a
    [`ConfigurationError`][idempotence.maintenance.completer_async.ConfigurationError]
    too (the ``idempotence`` command exits with 2).
    """


class MixedPlaceholders(ConfigurationError):
    """An application statement mixes ``:name`` placeholders with psycopg's
    ``%(name)s`` or ``%s``: write every parameter as ``:name``, which every SQL store
    takes."""


class StoreInTransaction(ConfigurationError):
    """This store has a transaction open in this thread or task, and the operation
    would need a connection of its own, so it would wait for that transaction forever:
    pass ``tx=`` (claim, finish) or call it after the transaction ends."""


class TransactionEnded(ConfigurationError):
    """This transaction's block has ended: use the transaction inside its `with` block.

    Once the block has committed or rolled back, the connection is the store's again
    (on PostgreSQL the pool's, for another request's transaction): a statement, or a
    ``tx=`` write, through a transaction kept past its block would run in someone
    else's, so it raises this at the call, before anything is sent.
    """


# -- a guarded function's errors (idempotence.idempotent, DESIGN 12) -------------------


class ArgumentsMismatch(IdempotenceError):
    """This key was already used for a call with different arguments (P2), so the
    function did not run: use a new key for each new operation, and call again with
    the same arguments to get the first call's result."""


class CallInProgress(IdempotenceError):
    """A call with this key is running elsewhere right now (P4), so the function did
    not run: call again after ``retry_after`` seconds to get its result, or guard the
    function with ``wait=`` to wait for it."""

    retry_after: float
    """Seconds until the running call's lock expires, if it dies (a live one beats)."""


class ResultNotStorable(ConfigurationError):
    """The function ran, but what it returned (or the exception it raised) cannot be
    stored for replay: declare a return type the decorator can store (JSON values,
    dataclasses, pydantic models) or give it ``serializer=(dump, load)``."""


# -- the client's errors: an idempotent request got no final answer (DESIGN 10) --------


class ClientError(IdempotenceError):
    """An idempotent request got no final answer."""


class KeyReused(ClientError):
    """The server refused the Idempotency-Key: it was already used for a different
    request (another method, path or body). This is a bug in the caller: make a new key
    for each new operation, and resend an operation's request unchanged."""


class RetriesExhausted(ClientError):
    """The request got no final answer before the client gave up (its attempts or its
    deadline ran out). The operation may still have run: retry later with the same
    Idempotency-Key to learn its outcome, never with a new one."""


# -- raised by the application's own steps, read by the flow engine (R5, R6) ----------


class Reject(Exception):
    """Raise from a phase to refuse the request with ``response``.

    Before the first phase commits, nothing is stored and the key is forgotten, so the
    client can correct the request and retry with the same key (R5). Later, the
    response is stored like any terminal answer.
    """

    def __init__(self, response: StoredResponse) -> None:
        super().__init__(f"request rejected with {response.status}")
        self.response = response


class Indeterminate(Exception):
    """Raise from a foreign call whose outcome is unknown (a timeout after the request
    was sent, a reset connection). ``TimeoutError`` and ``ConnectionError`` count too."""
