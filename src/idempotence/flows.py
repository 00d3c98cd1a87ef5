"""Resumable flows: atomic phases, recovery points, foreign calls (DESIGN 5, F1-F3).

A :class:`Flow` is a small DAG of steps keyed by recovery point. Running it claims
the key and then loops: read the recovery point, run the step registered there,
commit, repeat, until a step finishes with a response (R1).

* An **atomic phase** runs in ONE transaction on the store's database; the phase's own
  writes go through ``ctx.tx`` and commit together with the checkpoint, which is the
  transaction's last statement and is fenced by the lock token (R2, F1).
* A **foreign step** calls something outside the database (a payment provider) with
  no transaction open, using a key derived from the key row (R3, R4), and then records
  the call's result in an atomic phase. A crash between the call and the record makes
  the next attempt call again with the SAME derived key, and the provider's own
  idempotency absorbs the repeat. A call marked ``idempotent=False`` is never repeated
  blindly: a crash or an indeterminate failure makes the key errored, for a human (R6).

>>> rides = Flow("rides")
>>> @rides.phase("started")
... def create_ride(ctx: PhaseContext) -> Advance:
...     ctx.tx.execute("INSERT INTO rides (key_id) VALUES (?)", (ctx.lease.id,))
...     return Advance("ride_created")
>>> rides.foreign(
...     "ride_created", name="charge",
...     call=lambda ctx: provider.charge(2000, idempotency_key=ctx.key_for("charge")),
...     record=lambda ctx, charge: Finish(StoredResponse.of(201, body=charge["id"])),
... )                                                           # doctest: +SKIP
>>> result = rides.run(store, request)                          # doctest: +SKIP

The engine below is written once, as a generator of effects; :mod:`._flow_driver_async`
performs them on a sync or an async SQL store. A flow needs the SQL store's
transaction shared with its phases, so :meth:`Flow.run` takes a
:class:`~idempotence.Store`, not a :class:`~idempotence.KeyStore`: a backend without
one (Redis) is refused by type.

A run can be watched: ``run(store, request, observer=fn)`` calls ``fn(event)`` at each
boundary where a crash leaves a different state behind (the crash-injection harness,
:mod:`idempotence.testing.harness`, kills the worker there; F4):

* ``phase:<point>:before_commit``: the phase at ``<point>`` returned, its writes are
  in the open transaction, its checkpoint is not written yet;
* ``phase:<point>:after_commit``: the phase's transaction committed;
* ``call:<name>:before`` and ``call:<name>:after``: around foreign call ``<name>``,
  with no transaction open.

Metrics and traces come from the store instead: a store built with
``instrumentation=`` watches each run of a flow on it, each phase and each foreign
call (:mod:`idempotence.observability`).
"""

from __future__ import annotations

import contextlib
import enum
import json
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from .errors import ConfigurationError, LockLost
from .problems import Problem, ProblemDetails
from .states import (
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

if TYPE_CHECKING:
    from .stores import AsyncKeyStore, AsyncStore, KeyStore, Store

# -- what a phase returns (R2) ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Advance:
    """Commit the phase and continue from ``recovery_point``."""

    recovery_point: str


@dataclass(frozen=True, slots=True)
class Finish:
    """Commit the phase and store ``response``: the key is finished. A status of 400
    or more is a terminal answer too, stored and replayed (R5: a declined card)."""

    response: StoredResponse


@dataclass(frozen=True, slots=True)
class NoOp:
    """Commit the phase's writes, keep the recovery point, and end this attempt: the
    key is unlocked and the next attempt (a retry, the completer) resumes here. The
    caller gets an unstored 202."""


PhaseResult: TypeAlias = Advance | Finish | NoOp


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


INDETERMINATE = (Indeterminate, TimeoutError, ConnectionError)

# -- contexts ---------------------------------------------------------------------------


@dataclass(slots=True)
class PhaseContext:
    """What an atomic phase gets: the key, and the transaction to write in."""

    flow: Flow
    record: KeyRecord
    lease: Lease
    #: The phase's transaction: ``Transaction`` or ``AsyncTransaction``.
    tx: Any
    #: For the phase that records a foreign call: the call's return value.
    result: Any = None
    jobs: list[tuple[str, str, Any]] = field(default_factory=list)

    @property
    def params(self) -> Any:
        """The request parameters stored at the first claim."""
        return self.record.params

    def key_for(self, name: str) -> str:
        """The derived idempotency key of foreign call ``name`` (R4)."""
        return self.flow.key_for(self.lease.id, name)

    def stage(self, name: str, args: Any = None, *, job_key: str | None = None) -> None:
        """Stage job ``name`` with JSON ``args``: it commits with this phase (R7).

        Its ``job_key`` (the runner's dedup id) is derived from the key row, the
        phase and the job's place in it unless given.
        """
        json.dumps(args)  # fail in the phase, not at commit, on unserialisable args
        # The token keeps a phase that runs again in a later attempt (after a NoOp)
        # from colliding with the job it staged the first time.
        lease = self.lease
        place = f"{lease.id}-{lease.token}-{lease.recovery_point}-{name}-{len(self.jobs)}"
        key = job_key or f"{self.flow.name}-{place}"
        self.jobs.append((key, name, args if args is not None else {}))


@dataclass(slots=True)
class ForeignContext:
    """What a foreign call gets: the key, its derived keys, and a heartbeat (F2).

    ``heartbeat()`` extends the lock (fenced); on an async store it is a coroutine
    function. A call that outlasts the lock timeout must beat, or another worker may
    take the key over and the recording phase will be refused (F1).
    """

    flow: Flow
    record: KeyRecord
    lease: Lease
    heartbeat: Callable[[], Any]

    @property
    def params(self) -> Any:
        return self.record.params

    def key_for(self, name: str) -> str:
        return self.flow.key_for(self.lease.id, name)


# -- steps ------------------------------------------------------------------------------

PhaseFn: TypeAlias = Callable[[PhaseContext], "PhaseResult | Awaitable[PhaseResult]"]
CallFn: TypeAlias = Callable[[ForeignContext], Any]
RecordFn: TypeAlias = Callable[[PhaseContext, Any], "PhaseResult | Awaitable[PhaseResult]"]


@dataclass(frozen=True, slots=True)
class AtomicStep:
    recovery_point: str
    fn: PhaseFn


@dataclass(frozen=True, slots=True)
class ForeignStep:
    recovery_point: str
    name: str
    call: CallFn
    record: RecordFn
    idempotent: bool


Step: TypeAlias = AtomicStep | ForeignStep

#: Separates a recovery point from the foreign call a non-idempotent step has begun.
ATTEMPT_MARK = "~calling:"


def attempt_point(recovery_point: str, name: str) -> str:
    """The recovery point committed just before a non-idempotent call (R6)."""
    return f"{recovery_point}{ATTEMPT_MARK}{name}"


# -- results ----------------------------------------------------------------------------


class ResultKind(enum.Enum):
    """How a run of a flow ended."""

    #: This run finished the key; ``response`` is stored.
    EXECUTED = "executed"
    #: The key was finished before; ``response`` is the stored one (P3).
    REPLAYED = "replayed"
    #: The key belongs to another request (P2).
    MISMATCH = "mismatch"
    #: Another worker holds the key (P4).
    IN_PROGRESS = "in_progress"
    #: Another worker took the key over during this run; this run's writes were
    #: refused (F1).
    LOST = "lost"
    #: An unexpected error: rolled back, unlocked, ``response`` (500) not stored
    #: unless the flow stores server errors (R5).
    FAILED = "failed"
    #: The request was refused before its first phase committed: nothing stored (R5).
    REJECTED = "rejected"
    #: A phase returned NoOp: unlocked, to be resumed.
    PAUSED = "paused"
    #: A non-idempotent foreign call failed indeterminately: stored, flagged (R6).
    ERRORED = "errored"


@dataclass(frozen=True, slots=True)
class FlowResult:
    """The end of one run of a flow."""

    kind: ResultKind
    #: The claim this run made; None when a request-as-transaction run rolled back
    #: (its claim with it).
    claim: Claim | None
    #: The response to send; None for MISMATCH, IN_PROGRESS and LOST, whose wire
    #: form depends on the HTTP profile. A library problem (FAILED's 500, ERRORED's
    #: 502) is in neutral form: :meth:`~idempotence.problems.ProblemDetails.from_stored`
    #: reads it, and the HTTP layer renders it in the endpoint's profile (F6).
    response: StoredResponse | None = None
    #: Whether ``response`` is the stored one (replayed to every retry).
    stored: bool = False
    #: The exception behind FAILED, ERRORED or LOST.
    error: BaseException | None = None


def problem(status: int, title: str, detail: str) -> StoredResponse:
    """An RFC 9457 problem response of the application's own (a declined card): stored
    and replayed verbatim, whatever the endpoint's wire profile. The library's own
    problems are :class:`~idempotence.problems.ProblemDetails` instead."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    return StoredResponse.of(
        status, {"content-type": "application/problem+json"}, json.dumps(body).encode()
    )


#: R5: what a run that raised answers, in neutral form (rendered at the edge, F6).
SERVER_ERROR = ProblemDetails.of(
    Problem.SERVER_ERROR,
    "The request failed and nothing of it was stored. Retry with the same "
    "Idempotency-Key: the work resumes from its last completed step.",
).stored()
PAUSED_RESPONSE = StoredResponse.of(202, {"retry-after": "1"}, b"")


def indeterminate_response(name: str) -> StoredResponse:
    """R6: what a key errored by foreign call ``name`` answers, in neutral form."""
    return ProblemDetails.of(
        Problem.OUTCOME_UNKNOWN,
        f"The call {name!r} to an external system may or may not have taken effect, and "
        "it cannot be repeated safely. The request is on hold for an operator; retrying "
        "it will return this answer.",
    ).stored()


# -- observing a run (F4) -----------------------------------------------------------------


class Observer(Protocol):
    """Called with the name of each boundary a run crosses (see the module docstring).

    It runs on the worker's own thread, inside the phase's transaction for
    ``before_commit``: keep it quick, and let it raise only to abort the run.
    """

    def __call__(self, event: str, /) -> None: ...


# -- effects: what the engine asks its driver to do ---------------------------------------


@dataclass(frozen=True, slots=True)
class DoClaim:
    request: ClaimRequest


@dataclass(frozen=True, slots=True)
class DoPhase:
    """Run ``fn`` in a transaction, then close the phase; the driver returns
    ``(PhaseResult, Lease)``."""

    fn: Callable[..., Any]
    context: PhaseContext
    with_result: bool

    def event(self, moment: str) -> str:
        """The observer's name for this phase at ``moment``, by its step's recovery
        point (a non-idempotent call's recording phase runs at an attempt point)."""
        point = self.context.lease.recovery_point.partition(ATTEMPT_MARK)[0]
        return f"phase:{point}:{moment}"


@dataclass(frozen=True, slots=True)
class DoCall:
    """Run a foreign call outside any transaction; the driver returns its value."""

    flow: Flow
    step: ForeignStep
    record: KeyRecord
    lease: Lease

    def event(self, moment: str) -> str:
        return f"call:{self.step.name}:{moment}"


@dataclass(frozen=True, slots=True)
class DoInTransaction:
    """F3: claim, run ``fn`` and store its response in one transaction; the driver
    returns ``(Claim, PhaseResult | None)``."""

    request: ClaimRequest
    flow: Flow
    fn: PhaseFn

    def event(self, moment: str) -> str:
        return f"phase:{STARTED}:{moment}"


@dataclass(frozen=True, slots=True)
class DoCheckpoint:
    lease: Lease
    recovery_point: str


@dataclass(frozen=True, slots=True)
class DoFinish:
    lease: Lease
    response: StoredResponse
    error: str | None = None


@dataclass(frozen=True, slots=True)
class DoRelease:
    lease: Lease


@dataclass(frozen=True, slots=True)
class DoForget:
    lease: Lease


Effect: TypeAlias = (
    DoClaim | DoPhase | DoCall | DoInTransaction | DoCheckpoint | DoFinish | DoRelease | DoForget
)
Engine: TypeAlias = Generator[Effect, Any, FlowResult]


# -- the flow ---------------------------------------------------------------------------


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
        if not name or "~" in name:
            raise ConfigurationError(f"a flow name must be non-empty and without '~': {name!r}")
        self.name = name
        self.lock_timeout = lock_timeout
        self.retention = retention
        self.store_server_errors = store_server_errors
        self.request_as_transaction = request_as_transaction
        self.steps: dict[str, Step] = {}

    def __repr__(self) -> str:
        return f"Flow({self.name!r}, steps={list(self.steps)})"

    # -- building ----------------------------------------------------------------------

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
        if point == FINISHED or ATTEMPT_MARK in point:
            raise ConfigurationError(f"{point!r} cannot carry a step")
        if point in self.steps:
            raise ConfigurationError(f"flow {self.name!r} already has a step at {point!r}")
        if self.request_as_transaction and (point != STARTED or isinstance(step, ForeignStep)):
            raise ConfigurationError(
                "a request-as-transaction flow has one atomic phase, at 'started' (F3)"
            )
        self.steps[point] = step

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
    ) -> ClaimRequest:
        """The claim request for running this flow."""
        return ClaimRequest(
            scope=scope,
            key=key,
            fingerprint=fingerprint,
            method=method,
            path=path,
            flow=self.name,
            params=params if params is not None else {},
            lock_timeout=self.lock_timeout,
            retention=self.retention,
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
        self, store: Store, request: ClaimRequest, *, observer: Observer | None = None
    ) -> FlowResult:
        """Run (or resume, or replay) this flow for ``request`` on a sync store.

        ``store`` is a SQL store (:class:`~idempotence.Store`), never a bare
        :class:`~idempotence.KeyStore`: each phase's writes commit with its checkpoint
        in the store's transaction (R2), which a store without transactions shared
        with the application (Redis) cannot offer.

        ``observer`` is told of every boundary the run crosses (F4; see the module
        docstring); without one the run pays nothing for it. The store's
        instrumentation, if any, watches the run, its phases and its foreign calls
        (:mod:`idempotence.observability`).
        """
        from ._flow_driver import drive

        instrumentation = store.instrumentation
        if instrumentation is None:
            return drive(self.engine(request), store, observer)
        with instrumentation.run(self.name, request) as watch:
            return watch.done(drive(self.engine(request), store, observer))

    async def run_async(
        self, store: AsyncStore, request: ClaimRequest, *, observer: Observer | None = None
    ) -> FlowResult:
        """Run this flow on an async SQL store (:class:`~idempotence.AsyncStore`, for
        the reason given in :meth:`run`); phases and calls may be coroutines.
        ``observer`` is a plain function, as for :meth:`run`."""
        from ._flow_driver_async import drive_async

        instrumentation = store.instrumentation
        if instrumentation is None:
            return await drive_async(self.engine(request), store, observer)
        with instrumentation.run(self.name, request) as watch:
            return watch.done(await drive_async(self.engine(request), store, observer))

    def engine(self, request: ClaimRequest) -> Engine:
        """The flow's logic for one request, as a generator of effects."""
        if STARTED not in self.steps:
            raise ConfigurationError(f"flow {self.name!r} has no step at 'started'")
        if self.request_as_transaction:
            return self._in_one_transaction(request)
        return self._phases(request)

    def _in_one_transaction(self, request: ClaimRequest) -> Engine:
        step = self.steps[STARTED]
        assert isinstance(step, AtomicStep)
        try:
            claim, result = yield DoInTransaction(request, self, step.fn)
        except Reject as rejected:
            # The whole transaction, claim included, rolled back: nothing is stored.
            return FlowResult(ResultKind.REJECTED, None, rejected.response)
        except Exception as exc:
            return FlowResult(ResultKind.FAILED, None, SERVER_ERROR, error=exc)
        if claim.outcome is not Outcome.EXECUTE:
            return _from_claim(claim)
        assert isinstance(result, Finish)
        return FlowResult(ResultKind.EXECUTED, claim, result.response, stored=True)

    def _phases(self, request: ClaimRequest) -> Engine:
        claim: Claim = yield DoClaim(request)
        if claim.outcome is not Outcome.EXECUTE:
            return _from_claim(claim)
        assert claim.lease is not None
        lease, record = claim.lease, claim.record
        while True:
            point = lease.recovery_point
            step: Step | None = None
            try:
                if ATTEMPT_MARK in point:
                    # A non-idempotent call began and this worker never learned how it
                    # ended (it crashed): never repeat it (R6).
                    name = point.split(ATTEMPT_MARK, 1)[1]
                    return (yield from self._errored(claim, lease, name, None))
                step = self.steps.get(point)
                if step is None:
                    raise ConfigurationError(
                        f"flow {self.name!r} has no step at recovery point {point!r}"
                    )
                context = PhaseContext(self, record, lease, tx=None)
                if isinstance(step, AtomicStep):
                    result, lease = yield DoPhase(step.fn, context, with_result=False)
                else:
                    if not step.idempotent:
                        lease = yield DoCheckpoint(lease, attempt_point(point, step.name))
                    try:
                        value = yield DoCall(self, step, record, lease)
                    except INDETERMINATE as exc:
                        if step.idempotent:
                            raise
                        return (yield from self._errored(claim, lease, step.name, exc))
                    except Exception:
                        if not step.idempotent:
                            # The call failed determinately: it did not happen, so it
                            # may be tried again. Take the attempt mark back.
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
                return FlowResult(ResultKind.EXECUTED, claim, result.response, stored=True)
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


def _from_claim(claim: Claim) -> FlowResult:
    kind = {
        Outcome.REPLAY: ResultKind.REPLAYED,
        Outcome.MISMATCH: ResultKind.MISMATCH,
        Outcome.IN_PROGRESS: ResultKind.IN_PROGRESS,
    }[claim.outcome]
    response = claim.response if claim.outcome is Outcome.REPLAY else None
    return FlowResult(kind, claim, response, stored=response is not None)


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


#: The default registry.
flows = FlowRegistry()


if TYPE_CHECKING:
    # The refusal by type, proven by mypy: a store that is only a KeyStore cannot run
    # a flow. Strict mode reports these ignores as unused the day it could.
    async def _refused(
        flow: Flow, store: KeyStore, a_store: AsyncKeyStore, r: ClaimRequest
    ) -> None:
        flow.run(store, r)  # type: ignore[arg-type]
        await flow.run_async(a_store, r)  # type: ignore[arg-type]
