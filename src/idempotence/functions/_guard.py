"""A guarded function, without I/O: a call as one run of the engine (F6, DESIGN 12).

`Guard` holds what the decorator was told, checked once, and the engine run it
makes: a one-step flow whose step is the function (the application handler of
`idempotence.flows.handler`), or, with ``transactional=True``, the body of the one
atomic phase (F3). So the claim, the bounded wait for a twin (P10), the heartbeats
(F2), the settling of the key by what the function did (R5) and the transaction are
the engine's, written once; the drivers (`_driver_async`, and `_driver`
generated from it) only run the function for it.

What becomes of a call, decided here:

* the function returned: the value is stored (status 200) and the caller gets it;
  every replay gets it back, restored to the declared return type;
* it raised one of ``final_exceptions``: the exception is stored (status 400) and
  raised again, rebuilt from its class and arguments, on every replay;
* it raised anything else: the key is released (the transaction rolled back), so a
  retry runs the function again, and the exception propagates;
* the value (or final exception) cannot be stored: the key is finished with that
  verdict, so no retry runs the function a second time, and the caller (and every
  retry) gets [`ResultNotStorable`][idempotence.errors.ResultNotStorable].
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._frozen import quick_init
from ..errors import (
    ArgumentsMismatch,
    CallInProgress,
    ConfigurationError,
    LockLost,
    ResultNotStorable,
    StoreError,
)
from ..fingerprint import secret_pair
from ..flows import Flow, FlowResult, ResultKind
from ..flows.results import Captured, new_captured
from ..flows.steps import UNLIMITED
from ..states import (
    ClaimRequest,
    Lease,
    StoredResponse,
)
from ..stores.capabilities import Capability, capabilities_of
from ._arguments import Binder, Fingerprinter, Picker
from ._codec import Codec, NotStorable, codec_for
from ._options import Options, Serializer

__all__ = ["FUNCTION_FLOW", "CallContext", "CallState", "Guard", "current_call"]

FUNCTION_FLOW = "function"
"""The flow name stored on a guarded function's keys (its ``flow`` column)."""
RETURNED, RAISED, NOT_STORABLE = 200, 400, 422
"""What the function did, as the status of the stored response."""
_JSON = (("content-type", "application/json"),)


@quick_init
@dataclass(frozen=True, slots=True)
class CallContext:
    """What a guarded function can learn of the call it is running in:
    [`current_call`][idempotence.functions.current_call]."""

    name: str
    """The function's name as the guard knows it (its qualified name by default)."""
    scope: str
    key: str
    lease: Lease
    """The claimed key's lease; ``lease.id`` names derived keys (R4)."""
    tx: Any = None
    """With ``transactional=True``: the store transaction the claim opened. Write in
    it, and the writes commit with the stored result, or not at all (F3)."""

    def key_for(self, name: str) -> str:
        """The derived key for foreign call ``name`` (R4): the same on every attempt
        of this call, so the other side can deduplicate a repeat."""
        return f"{self.name}-{self.lease.id}-{name}"


CURRENT_CALL: contextvars.ContextVar[CallState | None] = contextvars.ContextVar(
    "idempotence_current_call", default=None
)
"""The guarded call running in this thread or task (`current_call` reads it): its
state, whose `CallContext` is made only if the function asks for it (most never do)."""


def current_call() -> CallContext:
    """The guarded call running in this thread or task.

    With ``transactional=True``, its ``tx`` is the transaction to write in.

    Raises:
        LookupError: no guarded function is running here.

    Example:
        ```python
        @idempotent(store, key="order_id", transactional=True)
        def place(order_id: str) -> int:
            tx = current_call().tx
            tx.execute("INSERT INTO orders (ref) VALUES (:ref)", {"ref": order_id})
            return 1
        ```
    """
    call = CURRENT_CALL.get()
    if call is None:
        raise LookupError("current_call() is only available inside a guarded function")
    return call.context()


class Guard:
    """A decorated function's settings, checked, and its engine run (see the module
    docstring). Built once, at decoration."""

    def __init__(self, fn: Callable[..., Any], options: Options) -> None:
        qualified = f"{fn.__module__}.{fn.__qualname__}"
        owner = f"@idempotent on {qualified}"
        options.check(owner)
        self.fn = fn
        self.name = options.name or qualified
        self.owner = owner
        self.signature = inspect.signature(fn)
        self.arguments = Binder(self.signature)
        self.key = Picker(options.key, self.signature, "key", owner)
        scope = options.scope
        self.scope = None if scope is None else Picker(scope, self.signature, "scope", owner)
        secrets = secret_pair(
            options.fingerprint_secret, options.previous_fingerprint_secret, owner
        )
        self.fingerprint = Fingerprinter(
            self.name, self.signature, options.fingerprint_exclude, owner, secrets
        )
        self.codec = _codec(fn, options.serializer, owner)
        self.final = _final(options.final_exceptions, owner)
        self.wait = options.wait
        self.transactional = options.transactional
        self.engine = Flow(
            FUNCTION_FLOW,
            lock_timeout=options.lock_timeout,
            retention=options.retention,
            request_as_transaction=options.transactional,
        )
        # Nothing is forgotten (no status is a "rejected request"), and a 5xx is never
        # made: an exception that is not final propagates, and releases the key.
        self.engine.handler(
            limit=UNLIMITED, stored_headers=frozenset({"content-type"}), heartbeat=options.heartbeat
        )
        self.run = self.engine.handler_engine()
        """The engine of one call: ``self.run(request, app, wait)``."""

    # -- before the call -----------------------------------------------------------------

    def check_store(self, store: Any, is_async: bool) -> None:
        """Refuse a store that cannot run this function, before anything is claimed."""
        store_async = inspect.iscoroutinefunction(getattr(store, "claim", None))
        if not callable(getattr(store, "claim", None)):
            raise ConfigurationError(
                f"{self.owner}: {store!r} is not a key store (give a store, or a function "
                "without arguments that returns one)"
            )
        if store_async != is_async:
            kind, wanted = ("an async", "a sync") if store_async else ("a sync", "an async")
            raise ConfigurationError(
                f"{self.owner}: {kind} store ({type(store).__name__}) cannot guard "
                f"{'an async def' if is_async else 'a def'} function: give it {wanted} "
                "store (Store for def, AsyncStore for async def)"
            )
        if self.transactional and Capability.TRANSACTIONS not in capabilities_of(store):
            raise ConfigurationError(
                f"{self.owner}: transactional=True needs a SQL store (PostgreSQL, SQLite, "
                f"SQLAlchemy, Django, or a cached store in front of one), not "
                f"{type(store).__name__}, which shares no transaction with the function"
            )

    def request(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[ClaimRequest, Mapping[str, Any]]:
        """The claim request of a call, and its bound arguments. Raises
        `TypeError` for arguments the function does not take (as calling it
        would), before anything is claimed."""
        arguments = self.arguments.bind(args, kwargs)
        key = self.key.pick(arguments, args, kwargs)
        scope = self.name if self.scope is None else self.scope.pick(arguments, args, kwargs)
        fingerprint, previous = self.fingerprint.of(arguments)
        # The engine's request (Flow.request) built in one step: its name, lock timeout
        # and retention, the method CALL and the function's name as the path.
        engine = self.engine
        request = ClaimRequest(
            scope,
            key,
            fingerprint,
            "CALL",
            self.name,
            FUNCTION_FLOW,
            {},
            engine.lock_timeout,
            engine.retention,
            previous,
        )
        return request, arguments

    # -- after it ------------------------------------------------------------------------

    def outcome(self, result: FlowResult, state: CallState) -> Any:
        """The call's answer: the value to return, or the exception to raise."""
        kind = result.kind
        if kind is ResultKind.EXECUTED:
            return state.answer()
        if kind is ResultKind.REPLAYED:
            assert result.response is not None
            return self.replay(result.response)
        request_key = result.claim.record.key if result.claim is not None else None
        if kind is ResultKind.MISMATCH:
            raise ArgumentsMismatch(
                f"the key {request_key!r} was already used for a call of {self.name} with "
                "different arguments: use a new key for each new operation",
                key=request_key,
            )
        if kind is ResultKind.IN_PROGRESS:
            assert result.claim is not None
            retry_after = result.claim.retry_after or 0.0
            raise CallInProgress(
                f"a call of {self.name} with the key {request_key!r} is running: call "
                f"again in {retry_after:.1f} s to get its result",
                retry_after=retry_after,
                key=request_key,
            )
        error = result.error
        if kind is ResultKind.LOST:
            # The function ran, stalled past its lock, and another call took the key
            # over: that call's result is the key's, not this one.
            raise LockLost(
                f"another call of {self.name} took the key {request_key!r} over while this "
                "one ran, so this one's result was not stored: call again with the same "
                "key to get the result the key holds",
                key=request_key,
            ) from error
        if isinstance(error, StoreError):
            # Nothing ran, or it rolled back (P11), or it ran and its result could not
            # be stored (AnswerNotStored): fail closed.
            raise error
        raise AssertionError(f"unexpected end of a guarded call: {result!r}")

    def replay(self, response: StoredResponse) -> Any:
        """What a finished call answers again: its value, restored to the declared
        type, or its final exception, raised again."""
        status, body = response.status, response.body
        if status == RETURNED:
            return self.codec.decode(body)
        stored = json.loads(body)
        if status == RAISED:
            raise self._rebuilt(stored)
        raise ResultNotStorable(
            f"{self.name} ran once with this key, but its result could not be stored, so "
            f"it will not run again: {stored.get('detail', '')}"
        )

    def _rebuilt(self, stored: Mapping[str, Any]) -> BaseException:
        name = stored.get("type", "")
        try:
            cls = _resolve(name)
        except (ImportError, AttributeError, ValueError) as exc:
            cls, problem = None, str(exc)
        else:
            problem = f"{name} is not one of final_exceptions"
        if cls is not None and issubclass(cls, self.final):
            return cls(*stored.get("args", ()))
        # The class moved or is no longer final (the code changed since the first
        # call): raise what happened in words rather than run the function again.
        return ResultNotStorable(
            f"{self.name} failed with this key before, with {name}: "
            f"{stored.get('message', '')} (it cannot be raised again as it was: {problem})"
        )


def _codec(fn: Callable[..., Any], serializer: Serializer | None, owner: str) -> Codec:
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except Exception as exc:
        raise ConfigurationError(f"{owner}: its annotations cannot be read: {exc}") from None
    try:
        return codec_for(hints.get("return", inspect.Signature.empty), serializer)
    except ConfigurationError as exc:  # named, as the other refusals: which function
        raise ConfigurationError(f"{owner}: {exc}") from None


def _final(classes: Iterable[type[BaseException]], owner: str) -> tuple[type[Exception], ...]:
    final: tuple[Any, ...] = (classes,) if isinstance(classes, type) else tuple(classes)
    for cls in final:
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise ConfigurationError(
                f"{owner}: final_exceptions must be exception classes, not {cls!r}"
            )
    return final


def _qualified(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve(name: str) -> type:
    module, sep, qualname = name.partition(":")
    if not sep or "<locals>" in qualname:
        raise ValueError(f"{name} cannot be imported")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not isinstance(found, type):
        raise ValueError(f"{name} is not a class")
    return found


class CallState:
    """One call's run of the function, as the engine's application (the drivers add
    ``run_app``): what it returned or raised, and the response stored for it."""

    __slots__ = (
        "_context",
        "args",
        "guard",
        "kwargs",
        "lease",
        "raised",
        "request",
        "tx",
        "unstorable",
        "value",
    )

    def __init__(
        self, guard: Guard, request: ClaimRequest, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.guard, self.request, self.args, self.kwargs = guard, request, args, kwargs
        self.value: Any = None
        self.raised: BaseException | None = None
        self.unstorable: NotStorable | None = None

    def enter(self, lease: Lease, tx: Any) -> contextvars.Token[CallState | None]:
        """Make the call current (until ``CURRENT_CALL.reset(token)``). Its lease and
        transaction are set here, the one place a running call gets them."""
        self.lease: Lease = lease
        self.tx: Any = tx
        self._context: CallContext | None = None
        return CURRENT_CALL.set(self)

    def context(self) -> CallContext:
        """The running call as `current_call` gives it (made once, when first asked)."""
        context = self._context
        if context is None:
            request = self.request
            context = CallContext(self.guard.name, request.scope, request.key, self.lease, self.tx)
            self._context = context
        return context

    def returned(self, value: Any) -> Captured:
        """The function returned ``value``: stored, checked to read back first."""
        self.value = value
        try:
            return new_captured(RETURNED, _JSON, self.guard.codec.encode(value), False)
        except NotStorable as exc:
            return self._not_storable(exc, f"it returned a value that cannot be stored: {exc}")

    def failed(self, exc: Exception) -> Captured:
        """The function raised ``exc``, one of the final exceptions: stored, if it
        can be raised again as it is (its class importable, its args JSON)."""
        self.raised = exc
        cls = type(exc)
        try:
            name = _qualified(cls)
            if _resolve(name) is not cls:
                raise NotStorable(f"{name} is not importable under its own name")
            args = json.loads(json.dumps(exc.args, allow_nan=False))
            cls(*args)
        except (NotStorable, ImportError, AttributeError, ValueError, TypeError) as problem:
            return self._not_storable(
                NotStorable(str(problem)),
                f"it raised {cls.__qualname__}({', '.join(map(repr, exc.args))}), a final "
                f"exception that cannot be raised again from what is stored ({problem}): "
                "give it JSON arguments and define it at module level",
            )
        body = {"type": name, "args": args, "message": str(exc)}
        return Captured(RAISED, _JSON, json.dumps(body).encode())

    def _not_storable(self, exc: NotStorable, detail: str) -> Captured:
        self.unstorable = NotStorable(detail)
        self.unstorable.__cause__ = exc
        return Captured(NOT_STORABLE, _JSON, json.dumps({"detail": detail}).encode())

    def answer(self) -> Any:
        """This run's answer to its caller: what the function returned, or raised."""
        if self.unstorable is not None:
            raise ResultNotStorable(
                f"{self.guard.name} ran, but {self.unstorable}. The key is finished with "
                "this error, so no retry runs the function again; fix the function and "
                "call it with a new key",
                key=self.request.key,
            ) from (self.raised or self.unstorable)
        if self.raised is not None:
            raise self.raised
        return self.value
