"""A flow: its steps, its engine (a generator of effects), and its runs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from .._frozen import quick_new
from ..errors import ConfigurationError, LockLost, Reject, StoreUnavailable
from ..states import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_RETENTION,
    FINISHED,
    STARTED,
    Claim,
    ClaimRequest,
    KeyRecord,
    Lease,
    Outcome,
    StoredResponse,
)
from ..stores import AsyncStore, Store
from ._driver import drive
from ._driver_async import drive_async
from .contexts import Observer, PhaseContext
from .effects import (
    DoCall,
    DoCheckpoint,
    DoClaim,
    DoFinish,
    DoForget,
    DoInTransaction,
    DoPhase,
    DoRelease,
    Effect,
    Engine,
)
from .handler import claimed, in_transaction, run_handler, run_handler_in_transaction
from .results import (
    PAUSED_RESPONSE,
    SERVER_ERROR,
    Finish,
    FlowResult,
    NoOp,
    ResultKind,
    from_claim,
    indeterminate_response,
    new_result,
)
from .steps import (
    INDETERMINATE,
    AtomicStep,
    CallFn,
    ForeignStep,
    HandlerStep,
    PhaseFn,
    RecordFn,
    Step,
)

_new_request = quick_new(ClaimRequest)
"""A ClaimRequest from its fields in order (`Flow.request`)."""

if TYPE_CHECKING:
    from ..observability import Instrumentation
    from ..stores import AsyncKeyStore, KeyStore


class Flow:
    """A named, registered request lifecycle (R1).

    ``lock_timeout`` bounds how long a silent worker keeps the key; ``retention`` how
    long a finished key replays (None: forever). ``store_server_errors`` stores the
    500 of an unexpected exception, as Stripe does, instead of letting the next retry
    resume. ``request_as_transaction`` (F3) is for purely local handlers: the claim,
    the single phase at ``started`` and its response commit in one transaction.
    """

    def __init__(
        self,
        name: str,
        *,
        lock_timeout: timedelta = DEFAULT_LOCK_TIMEOUT,
        retention: timedelta | None = DEFAULT_RETENTION,
        store_server_errors: bool = False,
        request_as_transaction: bool = False,
    ) -> None:
        if not name:
            raise ConfigurationError("a flow name must be non-empty")
        self.name = name
        self.lock_timeout = lock_timeout
        self.retention = retention
        self.store_server_errors = store_server_errors
        self.request_as_transaction = request_as_transaction
        self.steps: dict[str, Step] = {}

    def __repr__(self) -> str:
        return f"Flow({self.name!r}, steps={list(self.steps)})"

    # -- building ----------------------------------------------------------------------

    def handler(
        self,
        *,
        limit: int,
        rejected_statuses: frozenset[int] = frozenset(),
        stored_headers: frozenset[str] = frozenset({"content-type"}),
        heartbeat: timedelta | None = None,
        fixed_response: StoredResponse | None = None,
    ) -> None:
        """Make the application's own handler this flow's one step, at ``started`` (F6):
        a run claims the key, runs the handler it is given (``engine(..., app=...)``),
        and settles the key by the response's status (R5; see
        [`handler`][idempotence.flows.flow.Flow.handler]). A request-as-transaction flow
        runs it inside the claim's transaction instead (F3). Such a flow runs on any key
        store.

        While the handler runs, its lock is extended every ``heartbeat`` (default: a
        third of the flow's ``lock_timeout``), fenced (F1, F2): a live handler is never
        taken over however long it runs, and a dead one's key is free again within
        ``lock_timeout``. In a request-as-transaction flow the claim is not committed
        while the handler runs, so nothing beats.

        ``fixed_response`` is stored instead of the handler's own response, for a run
        whose answer is known before it runs (a consumer's acknowledgement; the
        handler's status still decides whether anything is stored, R5). A
        request-as-transaction flow then writes the key finished with its claim, and
        its COMMIT carries no finish: one write of the key row instead of two.
        """
        if heartbeat is not None and heartbeat <= timedelta(0):
            raise ConfigurationError(f"a heartbeat must be positive: {heartbeat!r}")
        if fixed_response is not None and self.store_server_errors:
            raise ConfigurationError(
                f"flow {self.name!r}: fixed_response= with store_server_errors=True would "
                "replay a failed request's server error as the fixed response: give one"
            )
        step = HandlerStep(
            STARTED,
            limit,
            frozenset(rejected_statuses),
            stored_headers,
            heartbeat,
            fixed_response,
        )
        self._add(step)

    def phase(self, recovery_point: str) -> Callable[[PhaseFn], PhaseFn]:
        """Register an atomic phase that runs when the key is at ``recovery_point``."""

        def register(fn: PhaseFn) -> PhaseFn:
            self._add(AtomicStep(recovery_point, fn))
            return fn

        return register

    def foreign(
        self,
        recovery_point: str,
        *,
        name: str,
        call: CallFn,
        record: RecordFn,
        idempotent: bool = True,
    ) -> None:
        """Register a foreign call at ``recovery_point`` and the phase that records
        its result (``record(ctx, result)``).

        ``idempotent`` says the other side deduplicates by ``ctx.key_for(name)``, so
        the call may be repeated after a crash. Without it, a crash during the call
        or an indeterminate failure errors the key (R6).
        """
        self._add(ForeignStep(recovery_point, name, call, record, idempotent))

    def _add(self, step: Step) -> None:
        point = step.recovery_point
        if point == FINISHED:
            raise ConfigurationError(f"{point!r} cannot carry a step")
        if point in self.steps:
            raise ConfigurationError(f"flow {self.name!r} already has a step at {point!r}")
        if self.request_as_transaction and (point != STARTED or isinstance(step, ForeignStep)):
            raise ConfigurationError(
                "a request-as-transaction flow has one atomic phase, at 'started'"
            )
        if self.steps and (isinstance(step, HandlerStep) or self._handler() is not None):
            raise ConfigurationError(
                f"flow {self.name!r}: an application handler is a flow's only step"
            )
        self.steps[point] = step

    def _handler(self) -> HandlerStep | None:
        step = self.steps.get(STARTED)
        return step if isinstance(step, HandlerStep) else None

    def key_for(self, key_id: int, name: str) -> str:
        """The derived key for foreign call ``name`` of key row ``key_id`` (R4)."""
        return f"{self.name}-{key_id}-{name}"

    def request(
        self,
        *,
        scope: str,
        key: str,
        fingerprint: str,
        params: Any = None,
        method: str = "POST",
        path: str = "/",
        previous_fingerprint: str | None = None,
    ) -> ClaimRequest:
        """The claim request for running this flow (``previous_fingerprint``: the
        request's fingerprint under the previous secret, while secrets rotate)."""
        # Every request builds one: past the class call (see quick_new).
        return _new_request(
            scope,
            key,
            fingerprint,
            method,
            path,
            self.name,
            params if params is not None else {},
            self.lock_timeout,
            self.retention,
            previous_fingerprint,
        )

    def resume_request(self, record: KeyRecord) -> ClaimRequest:
        """The claim request that resumes ``record`` from its stored parameters (B2)."""
        return self.request(
            scope=record.scope,
            key=record.key,
            fingerprint=record.fingerprint,
            params=record.params,
            method=record.method,
            path=record.path,
        )

    # -- running -----------------------------------------------------------------------

    def run(
        self,
        store: Store,
        request: ClaimRequest,
        *,
        observer: Observer | None = None,
        wait: timedelta | None = None,
    ) -> FlowResult:
        """Run (or resume, or replay) this flow for ``request`` on a sync store.

        ``store`` is a SQL store ([`Store`][idempotence.testing.harness.Store]), never a
        bare [`KeyStore`][idempotence.stores.redis.KeyStore]: each phase's writes commit
        with its checkpoint in the store's transaction (R2), which a store without
        transactions shared with the application (Redis) cannot offer.

        ``observer`` is told of every boundary the run crosses (F4; see the module
        docstring); without one the run pays nothing for it. The store's
        instrumentation, if any, watches the run, its phases and its foreign calls
        ([`idempotence.observability`][idempotence.observability]).

        ``wait`` makes a run that finds the key in progress elsewhere wait for it that
        long (P10), then replay it or take it over, instead of ending IN_PROGRESS.
        """
        self._check_store(store, Store)
        engine = watched(store.instrumentation, self.name, request, self.engine(request, wait=wait))
        return drive(engine, store, observer)

    async def run_async(
        self,
        store: AsyncStore,
        request: ClaimRequest,
        *,
        observer: Observer | None = None,
        wait: timedelta | None = None,
    ) -> FlowResult:
        """Run this flow on an async SQL store
        ([`AsyncStore`][idempotence.testing.harness.AsyncStore], for the reason given in
        [`run`][idempotence.flows.flow.Flow.run]); phases and calls may be coroutines.
        ``observer`` is a plain function, as for
        [`run`][idempotence.flows.flow.Flow.run]."""
        self._check_store(store, AsyncStore)
        engine = watched(store.instrumentation, self.name, request, self.engine(request, wait=wait))
        return await drive_async(engine, store, observer)

    def _check_store(self, store: object, kind: type) -> None:
        """Refuse a store without transactions before anything is claimed: a run
        that failed at its first phase would leave the key locked until its timeout."""
        if not isinstance(store, kind):
            raise ConfigurationError(
                f"flow {self.name!r} needs a SQL store ({kind.__name__}: PostgreSQL or "
                f"SQLite, or a cached store in front of one), not {type(store).__name__}: "
                "each phase commits in the store's transaction"
            )

    def engine(
        self, request: ClaimRequest, *, wait: timedelta | None = None, app: Any = None
    ) -> Engine:
        """The flow's logic for one request, as a generator of effects (F6).

        ``wait`` bounds the wait for a twin (P10). ``app`` runs the application
        handler of a flow made with [`handler`][idempotence.flows.flow.Flow.handler] (see
        [`DoHandle`][idempotence.http.wsgi.DoHandle]).
        """
        step = self.steps.get(STARTED)
        if step is None:
            raise ConfigurationError(f"flow {self.name!r} has no step at 'started'")
        if isinstance(step, HandlerStep):
            if self.request_as_transaction:
                return run_handler_in_transaction(self, step, request, app, wait)
            return run_handler(self, step, request, app, wait)
        if self.request_as_transaction:
            assert isinstance(step, AtomicStep)
            return self._in_one_transaction(request, step, wait)
        return self._phases(request, wait)

    def handler_engine(self) -> Callable[[ClaimRequest, Any, timedelta | None], Engine]:
        """What [`engine`][idempotence.flows.flow.Flow.engine] makes of this flow, a
        flow made with [`handler`][idempotence.flows.flow.Flow.handler], chosen once:
        call it with the request, the app and the wait, for an entry point that runs
        the flow on every call (a guarded function)."""
        step = self._handler()
        if step is None:
            raise ConfigurationError(f"flow {self.name!r} has no handler step")
        run = run_handler_in_transaction if self.request_as_transaction else run_handler
        return partial(run, self, step)

    def handover(self, request: ClaimRequest) -> Engine:
        """Claim the key and hand it over unfinished, for a run in the background
        (asynchronous acceptance): the result is PAUSED, the key claimed (P1) and
        released at its recovery point, so the background run of the flow takes it over
        (P5), or the completer does if that run never starts (B2). A key this claim did
        not win gives the claim's result (P2, P3, P4), as any run does.

        Args:
            request: the request whose key is claimed.

        Returns:
            An engine (a generator of effects, run by a driver) whose result is PAUSED
            when the key was claimed and released, else REPLAYED, MISMATCH or
            IN_PROGRESS.

        Raises:
            StoreError: the claim or the release failed; nothing was handed over.
        """
        claim = yield from claimed(request, None)
        if claim.outcome is not Outcome.EXECUTE:
            return from_claim(claim)
        assert claim.lease is not None
        yield DoRelease(claim.lease)
        return FlowResult(ResultKind.PAUSED, claim, PAUSED_RESPONSE)

    def _in_one_transaction(
        self, request: ClaimRequest, step: AtomicStep, wait: timedelta | None
    ) -> Engine:
        try:
            effect = DoInTransaction(request, self, step.fn)
            claim, result = yield from in_transaction(effect, wait)
        except Reject as rejected:
            # The whole transaction, claim included, rolled back: nothing is stored.
            return FlowResult(ResultKind.REJECTED, None, rejected.response)
        except Exception as exc:
            return FlowResult(ResultKind.FAILED, None, SERVER_ERROR, error=exc)
        if claim.outcome is not Outcome.EXECUTE:
            return from_claim(claim)
        assert isinstance(result, Finish)
        return new_result(ResultKind.EXECUTED, claim, result.response, True, None, False)

    def _phases(self, request: ClaimRequest, wait: timedelta | None) -> Engine:
        claim = yield from claimed(request, wait)
        if claim.outcome is not Outcome.EXECUTE:
            return from_claim(claim)
        assert claim.lease is not None
        lease, record = claim.lease, claim.record
        while True:
            point = lease.recovery_point
            step: Step | None = None
            try:
                if lease.calling is not None:
                    # A non-idempotent call began and its worker never recorded how it
                    # ended (it crashed, or its recording phase failed): never repeat
                    # it (R6).
                    return (yield from self._errored(claim, lease, lease.calling, None))
                step = self.steps.get(point)
                if step is None:
                    raise ConfigurationError(
                        f"flow {self.name!r} has no step at recovery point {point!r}"
                    )
                context = PhaseContext(self, record, lease, tx=None)
                if isinstance(step, AtomicStep):
                    result, lease = yield DoPhase(step.fn, context, with_result=False)
                elif isinstance(step, HandlerStep):
                    raise ConfigurationError(f"flow {self.name!r}: a handler runs at 'started'")
                else:
                    if not step.idempotent:
                        lease = yield DoCheckpoint(lease, point, calling=step.name)
                    try:
                        value = yield DoCall(self, step, record, lease)
                    except INDETERMINATE as exc:
                        if step.idempotent:
                            raise
                        return (yield from self._errored(claim, lease, step.name, exc))
                    except Exception:
                        if not step.idempotent:
                            # The call failed determinately: it did not happen, so it
                            # may be tried again. Take the attempt back (calling cleared).
                            lease = yield DoCheckpoint(lease, point)
                        raise
                    context = PhaseContext(self, record, lease, tx=None, result=value)
                    result, lease = yield DoPhase(step.record, context, with_result=True)
            except Reject as rejected:
                return (yield from self._rejected(claim, lease, rejected.response, step))
            except LockLost as exc:
                return FlowResult(ResultKind.LOST, claim, error=exc)
            except Exception as exc:
                return (yield from self._failed(claim, lease, exc))
            except GeneratorExit:
                raise
            except BaseException:
                # Cancelled (the client went away) or interrupted: the phase rolled
                # back; unlock the key so a retry need not wait out the lock timeout.
                with contextlib.suppress(Exception):
                    yield DoRelease(lease)
                raise
            if isinstance(result, Finish):
                return new_result(ResultKind.EXECUTED, claim, result.response, True, None, False)
            if isinstance(result, NoOp):
                # The phase committed. If another worker took the key over since, it
                # resumes the key, which is all the release was for.
                with contextlib.suppress(LockLost):
                    yield DoRelease(lease)
                return FlowResult(ResultKind.PAUSED, claim, PAUSED_RESPONSE)

    def _rejected(
        self, claim: Claim, lease: Lease, response: StoredResponse, step: Step | None
    ) -> Engine:
        try:
            if lease.recovery_point == STARTED and isinstance(step, AtomicStep):
                # Nothing was committed yet: store nothing, so the client can correct
                # the request and retry with the same key (R5). Not after a foreign
                # step at 'started': its call may have taken effect (in this run or a
                # crashed one), and forgetting the key would give the corrected
                # request a new key row, so a new derived key and a second effect.
                yield DoForget(lease)
                return FlowResult(ResultKind.REJECTED, claim, response)
            yield DoFinish(lease, response)
        except LockLost as lost:
            return FlowResult(ResultKind.LOST, claim, error=lost)
        return FlowResult(ResultKind.EXECUTED, claim, response, stored=True)

    def _failed(self, claim: Claim, lease: Lease, exc: Exception) -> Engine:
        try:
            if self.store_server_errors:
                yield DoFinish(lease, SERVER_ERROR)
                return FlowResult(ResultKind.FAILED, claim, SERVER_ERROR, stored=True, error=exc)
            yield DoRelease(lease)
        except LockLost as lost:
            if isinstance(exc, StoreUnavailable):
                # The phase's COMMIT may have landed before the store stopped
                # answering (a partition: DESIGN 13). Then the refused release is our
                # own phase having finished the key, not another worker's takeover:
                # answer the unknown outcome as the store failure (503), and the
                # retry replays or resumes.
                return FlowResult(ResultKind.FAILED, claim, SERVER_ERROR, error=exc)
            return FlowResult(ResultKind.LOST, claim, error=lost)
        return FlowResult(ResultKind.FAILED, claim, SERVER_ERROR, error=exc)

    def _errored(self, claim: Claim, lease: Lease, name: str, exc: BaseException | None) -> Engine:
        response = indeterminate_response(name)
        reason = f"foreign call {name!r}: " + (
            f"indeterminate failure: {exc!r}" if exc else "a worker died during the call"
        )
        try:
            yield DoFinish(lease, response, error=reason)
        except LockLost as lost:
            return FlowResult(ResultKind.LOST, claim, error=lost)
        return FlowResult(ResultKind.ERRORED, claim, response, stored=True, error=exc)


def finish_errored(
    request: ClaimRequest, response: StoredResponse, reason: str
) -> Generator[Effect, Any, Claim]:
    """Claim the key and finish it errored (R6), for a run that was given up (a
    dead-lettered message, a key the completer stopped resuming): it is listed for a
    human (``idempotence keys list --state errored``) and every later request with it
    is answered ``response``. The claim is the fence (F1): a key that another run holds
    or has finished is left as it is, and the claim that says so is returned; a finish
    refused because the key was taken over meanwhile raises
    [`LockLost`][idempotence.maintenance.completer_async.LockLost].

    Args:
        request: the request whose key is given up.
        response: what every later request with the key is answered.
        reason: why it was given up, stored as the key's error.

    Returns:
        A generator of the engine's effects (run it with a driver) whose result is the
        claim: EXECUTE when this finished the key errored.

    Raises:
        LockLost: the key was taken over between the claim and the finish.
    """
    claim: Claim = yield DoClaim(request)
    if claim.outcome is Outcome.EXECUTE:
        assert claim.lease is not None
        yield DoFinish(claim.lease, response, error=reason)
    return claim


# -- the registry -----------------------------------------------------------------------


class FlowRegistry:
    """Flows by name, so anything (an HTTP request, the completer, a consumer) can
    resume a key by the flow name stored on it."""

    def __init__(self) -> None:
        self._flows: dict[str, Flow] = {}

    def register(self, flow: Flow) -> Flow:
        existing = self._flows.get(flow.name)
        if existing is not None and existing is not flow:
            raise ConfigurationError(f"another flow is registered as {flow.name!r}")
        self._flows[flow.name] = flow
        return flow

    def get(self, name: str) -> Flow:
        try:
            return self._flows[name]
        except KeyError:
            raise ConfigurationError(f"no flow is registered as {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._flows

    def __iter__(self) -> Any:
        return iter(self._flows.values())


flows = FlowRegistry()
"""The default registry."""


def watched(
    instrumentation: Instrumentation | None, name: str, request: ClaimRequest, engine: Engine
) -> Engine:
    """``engine`` watched as one run of flow ``name`` by ``instrumentation``; without
    one, ``engine`` itself: nothing is added."""
    if instrumentation is None:
        return engine
    return _watching(instrumentation, name, request, engine)


def _watching(
    instrumentation: Instrumentation, name: str, request: ClaimRequest, engine: Engine
) -> Engine:
    with instrumentation.run(name, request) as watch:
        return watch.done((yield from engine))


if TYPE_CHECKING:
    # The refusal by type, proven by mypy: a store that is only a KeyStore cannot run
    # a flow. Strict mode reports these ignores as unused the day it could.
    async def _refused(
        flow: Flow, store: KeyStore, a_store: AsyncKeyStore, r: ClaimRequest
    ) -> None:
        flow.run(store, r)  # type: ignore[arg-type]
        await flow.run_async(a_store, r)  # type: ignore[arg-type]
