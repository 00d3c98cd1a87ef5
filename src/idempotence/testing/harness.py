"""The crash-injection harness: kill a flow at every boundary and prove it recovers (F4).

Point it at a flow of your own. The harness runs the flow once, cleanly, in a child
process, to learn its boundaries (the events of [`Observer`][idempotence.testing.harness.Observer]:
before and after each phase commits, around each foreign call, and whatever your
downstream fakes report, such as the provider's own commit). Then, for every
boundary, it runs the flow in a fresh child that SIGKILLs itself exactly there, and
recovers the key twice over, separately:

* **retry**: the client retries with the same key, in another fresh process;
* **resume**: the key is left alone until its lock expires, then resumed from its
  stored parameters, as the completer does (``flow.run(store, flow.resume_request(record))``).

After each recovery it asserts what exactly-once means: the key reached a terminal
state; no downstream effect and no local row exists twice (the target's *census* never
counts more than a clean run left behind, nor less unless the key is errored, R6); the
response is the clean run's; and every later retry replays it byte for byte. It returns
a [`CrashReport`][idempotence.testing.harness.CrashReport] and raises ``AssertionError``
listing every violation.

The flow is named by an importable ``"module:function"`` factory, so each child can
build it; the factory takes a JSON-able config and returns a
[`Target`][idempotence.testing.harness.Target]::

    # myapp/crash.py
    def target(config):
        provider = FakeProvider(config["provider"])
        flow = build_checkout_flow(provider)              # your flow
        return Target(
            flow=flow,
            open_store=lambda: open_store(config["database"]),
            request=lambda scope, key: flow.request(scope=scope, key=key, fingerprint="f"),
            census=lambda store, record: {
                "orders": count_orders(store, record.id),
                "charges": len(provider.charges(reference=f"{record.scope}/{record.key}")),
            },
            instrument=lambda observe: setattr(
                provider, "after_commit", lambda charge: observe("provider:after_commit")
            ),
        )

    # tests/test_checkout_crashes.py
    def test_checkout_survives_a_crash_anywhere(database_url, tmp_path):
        report = crash_test(
            "myapp.crash:target",
            {"database": database_url, "provider": str(tmp_path / "pay.sqlite3")},
        )
        assert all(result.killed for result in report.results)

Give the flow a short ``lock_timeout`` (a fraction of a second): a killed worker's
key stays locked that long before anyone may resume it.
"""

from __future__ import annotations

import enum
import importlib
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..flows import Flow, FlowResult, Observer, ResultKind
from ..states import ClaimRequest, KeyRecord, KeyState, StoredResponse
from ..stores import AsyncStore, Store
from ._workers import Flavour, KillPoint, Worker, WorkerResult, spawn_worker

# The workers (one run in a child process) live in ._workers, and are public from here.
__all__ = [
    "CrashReport",
    "KillPoint",
    "KillResult",
    "Recovery",
    "Target",
    "Worker",
    "WorkerResult",
    "crash_test",
    "load_target",
    "settle",
    "spawn_worker",
]


def _uninstrumented(observer: Observer) -> None:
    pass


@dataclass(frozen=True)
class Target:
    """A flow under test, and what the harness needs to drive and judge it."""

    flow: Flow
    open_store: Callable[[], Store]
    """Open the key store (each process opens its own)."""
    request: Callable[[str, str], ClaimRequest]
    """The request to run for ``(scope, key)``; the same arguments give the same request."""
    census: Callable[[Store, KeyRecord], Mapping[str, int]]
    """Named counts of what the run of ``record`` left behind: local rows, downstream
    effects. A recovered run must never count more than a clean run."""
    instrument: Callable[[Observer], None] = _uninstrumented
    """Wire the downstream fakes' own boundaries (a provider's commit) to ``observer``,
    so the harness can kill inside a foreign call too."""
    open_async_store: Callable[[], AsyncStore] | None = None
    """Open the async key store, for ``flavour="async"`` runs."""


def load_target(factory: str, config: Mapping[str, Any]) -> Target:
    """Build the target that ``"module:function"`` makes from ``config``."""
    module_name, sep, attribute = factory.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"name a target factory as 'module:function', not {factory!r}")
    found: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        found = getattr(found, part)
    target = found(dict(config))
    if not isinstance(target, Target):
        raise TypeError(f"{factory} returned {type(target).__name__}, not a Target")
    return target


# -- settling a key: retry until the flow's answer is final ------------------------------

FINAL = frozenset(
    {
        ResultKind.EXECUTED,
        ResultKind.REPLAYED,
        ResultKind.ERRORED,
        ResultKind.REJECTED,
        ResultKind.MISMATCH,
    }
)
"""Results that end a client's retries: the answer is final."""


def settle(attempt: Callable[[], FlowResult], *, timeout: float) -> tuple[FlowResult, int]:
    """Call ``attempt`` until its result is final, as a patient client would: after
    IN_PROGRESS, once the holder's lock expires; after an unstored failure, a lost
    lock or a pause, at once. Returns the last result and the number of attempts."""
    deadline = time.monotonic() + timeout
    attempts = 0
    while True:
        result = attempt()
        attempts += 1
        if result.kind in FINAL or result.stored or time.monotonic() >= deadline:
            return result, attempts
        wait = 0.02
        if result.kind is ResultKind.IN_PROGRESS and result.claim is not None:
            wait = (result.claim.retry_after or 0.0) + 0.02
        time.sleep(min(wait, max(deadline - time.monotonic(), 0.0)))


# -- the report ---------------------------------------------------------------------------


class Recovery(enum.Enum):
    """How a killed run's key is recovered."""

    RETRY = "retry"
    """The client retries with the same key, from a fresh process."""
    RESUME = "resume"
    """The key is resumed from its stored parameters once its lock expires (B2)."""


@dataclass(frozen=True)
class KillResult:
    """One kill and one recovery."""

    point: KillPoint
    recovery: Recovery
    killed: bool
    """Whether the worker was killed at ``point`` (False: the run never got there)."""
    state: KeyState | None
    """The key's state after the recovery (None: the key is gone)."""
    status: int | None
    """The stored response's status."""
    attempts: int
    """Runs the recovery took."""
    duplicates: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """``{census name: (clean run's count, this run's count)}`` where this run has more."""
    violations: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass(frozen=True)
class CrashReport:
    """What [`crash_test`][idempotence.testing.harness.crash_test] found: the clean run,
    and one row per kill and recovery."""

    factory: str
    baseline_status: int
    baseline_census: Mapping[str, int]
    points: tuple[KillPoint, ...]
    results: tuple[KillResult, ...]
    seconds: float

    @property
    def violations(self) -> list[str]:
        return [
            f"kill at {r.point}, then {r.recovery.value}: {v}"
            for r in self.results
            for v in r.violations
        ]

    def __str__(self) -> str:
        lines = [
            f"crash test of {self.factory}: {len(self.points)} kill points, "
            f"{len(self.results)} recoveries in {self.seconds:.1f} s; clean run: "
            f"{self.baseline_status} {dict(self.baseline_census)}",
        ]
        for r in self.results:
            dupes = ", ".join(f"{n} {a}->{b}" for n, (a, b) in r.duplicates.items()) or "-"
            state = r.state.value if r.state else "missing"
            lines.append(
                f"  {'ok ' if r.ok else 'BAD'} {r.point!s:<42} {r.recovery.value:<6} "
                f"killed={'yes' if r.killed else 'NO '} {state:<10} {r.status} "
                f"attempts={r.attempts} duplicates: {dupes}"
            )
        return "\n".join(lines)


# -- the harness --------------------------------------------------------------------------

_KEY = "k"
"""Every run uses this key, each kill in a scope of its own."""


@dataclass(frozen=True)
class _CleanRun:
    """The uninterrupted run: its boundaries are the kill points, its census the norm."""

    response: StoredResponse
    census: Mapping[str, int]
    points: tuple[KillPoint, ...]


@dataclass(frozen=True)
class _Campaign:
    """What every kill of one crash test shares."""

    factory: str
    config: Mapping[str, Any]
    target: Target
    store: Store
    flavour: Flavour
    timeout: float
    replays: int
    clean: _CleanRun

    def spawn(
        self, scope: str, workdir: Path, *, kill_at: KillPoint | None = None, retry: bool = False
    ) -> Worker:
        return spawn_worker(
            self.factory,
            self.config,
            scope=scope,
            key=_KEY,
            workdir=workdir,
            kill_at=kill_at,
            retry=retry,
            flavour=self.flavour,
            timeout=self.timeout,
        )


def crash_test(
    factory: str,
    config: Mapping[str, Any],
    *,
    recoveries: Sequence[Recovery] = (Recovery.RETRY, Recovery.RESUME),
    select: Callable[[KillPoint], bool] | None = None,
    flavour: Flavour = "sync",
    replays: int = 2,
    parallel: int = 2,
    timeout: float = 60.0,
    check: bool = True,
) -> CrashReport:
    """Kill the target's flow at every boundary, recover each way, judge each outcome.

    ``select`` narrows the kill points; ``flavour="async"`` runs the workers with
    ``run_async``; ``parallel`` kill points run at once (each in a scope of its own);
    ``replays`` later retries must replay the stored response. With ``check`` (the
    default), any violation raises ``AssertionError`` with the full report.
    """
    started = time.monotonic()
    target = load_target(factory, config)
    store = target.open_store()
    prefix = f"crash-{uuid.uuid4().hex[:10]}"
    try:
        with tempfile.TemporaryDirectory(prefix="idempotence-crash-") as tmp:
            workdir = Path(tmp)
            clean = _survey(
                factory,
                config,
                target,
                store,
                f"{prefix}-clean",
                workdir / "clean",
                flavour,
                timeout,
            )
            campaign = _Campaign(factory, config, target, store, flavour, timeout, replays, clean)
            points = tuple(p for p in clean.points if select is None or select(p))

            def one(job: tuple[int, KillPoint, Recovery]) -> KillResult:
                n, point, recovery = job
                run = f"{n}-{recovery.value}"
                return _kill_and_recover(
                    campaign, point, recovery, scope=f"{prefix}-{run}", workdir=workdir / run
                )

            jobs = [(n, p, r) for n, p in enumerate(points) for r in recoveries]
            with ThreadPoolExecutor(max(parallel, 1)) as pool:
                results = tuple(pool.map(one, jobs))
    finally:
        store.close()
    report = CrashReport(
        factory=factory,
        baseline_status=clean.response.status,
        baseline_census=clean.census,
        points=points,
        results=results,
        seconds=time.monotonic() - started,
    )
    if check and report.violations:
        raise AssertionError(
            f"{len(report.violations)} exactly-once violation(s):\n"
            + "\n".join(f"  - {v}" for v in report.violations)
            + f"\n\n{report}"
        )
    return report


def _survey(
    factory: str,
    config: Mapping[str, Any],
    target: Target,
    store: Store,
    scope: str,
    workdir: Path,
    flavour: Flavour,
    timeout: float,
) -> _CleanRun:
    # Run the flow once without a kill, to learn its boundaries and what it leaves behind.
    survey = spawn_worker(
        factory, config, scope=scope, key=_KEY, workdir=workdir, flavour=flavour, timeout=timeout
    )
    survey.wait(timeout)
    clean = survey.result()
    record = store.get(scope, _KEY)
    if clean is None or clean.kind is not ResultKind.EXECUTED or record is None:
        raise AssertionError(
            f"the clean run of {factory} did not finish: {clean or 'no result'}\n{survey.stderr()}"
        )
    assert clean.response is not None
    return _CleanRun(clean.response, dict(target.census(store, record)), tuple(survey.events()))


_Recovered = tuple[FlowResult | WorkerResult | None, int, list[str]]
"""What a recovery answered (None: the retrying worker died), the runs it took, and
what went wrong on the way."""


def _kill_and_recover(
    campaign: _Campaign, point: KillPoint, recovery: Recovery, *, scope: str, workdir: Path
) -> KillResult:
    victim = campaign.spawn(scope, workdir / "killed", kill_at=point)
    victim.wait(campaign.timeout)
    violations: list[str] = []
    if not victim.killed and victim.result() is None:
        violations.append(f"the worker failed instead of being killed:\n{victim.stderr()}")

    if recovery is Recovery.RETRY:
        recovered, attempts, problems = _recover_by_retry(campaign, scope, workdir / "retry")
    else:
        recovered, attempts, problems = _recover_by_resume(campaign, scope)
    violations += problems

    record = campaign.store.get(scope, _KEY)
    if record is None:
        violations.append("the key is gone: nothing records what was done")
        return KillResult(
            point, recovery, victim.killed, None, None, attempts, {}, tuple(violations)
        )
    duplicates, problems = _judge(campaign, scope, record, recovered, attempts)
    stored = record.response
    return KillResult(
        point,
        recovery,
        victim.killed,
        _state(record),
        stored.status if stored is not None else None,
        attempts,
        duplicates,
        tuple(violations + problems),
    )


def _recover_by_retry(campaign: _Campaign, scope: str, workdir: Path) -> _Recovered:
    # The client's move: retry with the same key from a fresh process, until final.
    retry = campaign.spawn(scope, workdir, retry=True)
    retry.wait(campaign.timeout + 10)
    recovered = retry.result()
    if recovered is None:
        return None, 0, [f"the retrying worker failed:\n{retry.stderr()}"]
    return recovered, recovered.attempts, []


def _recover_by_resume(campaign: _Campaign, scope: str) -> _Recovered:
    # The completer's move, once the killed worker's lock has expired.
    store, target = campaign.store, campaign.target
    recovered, attempts = settle(
        lambda: _resume(target, store, scope, _KEY), timeout=campaign.timeout
    )
    return recovered, attempts, []


def _judge(
    campaign: _Campaign,
    scope: str,
    record: KeyRecord,
    recovered: FlowResult | WorkerResult | None,
    attempts: int,
) -> tuple[dict[str, tuple[int, int]], list[str]]:
    # Exactly-once, after a recovery: a terminal state, the clean run's census and
    # response, and replays of it ever after. Returns the duplicates and the violations.
    violations: list[str] = []
    stored = record.response
    if not record.finished or stored is None:
        violations.append(
            f"no terminal state: the key is {_state(record).value} at "
            f"{record.recovery_point!r} after {attempts} attempt(s)"
        )
    errored = record.error is not None
    census = campaign.target.census(campaign.store, record)
    duplicates, problems = _compare_census(campaign.clean.census, census, errored=errored)
    violations += problems
    if stored is not None:
        violations += _check_response(campaign, scope, stored, recovered, errored=errored)
    return duplicates, violations


def _compare_census(
    baseline: Mapping[str, int], census: Mapping[str, int], *, errored: bool
) -> tuple[dict[str, tuple[int, int]], list[str]]:
    # More than a clean run is a duplicate; fewer is a loss, unless the key is errored
    # (R6: an errored key may have stopped short of some effects).
    duplicates: dict[str, tuple[int, int]] = {}
    violations: list[str] = []
    for name in sorted(set(census) | set(baseline)):
        expected, found = baseline.get(name, 0), census.get(name, 0)
        if found > expected:
            duplicates[name] = (expected, found)
            violations.append(f"{name}: {found} where a clean run leaves {expected} (duplicate)")
        elif found < expected and not errored:
            violations.append(f"{name}: {found} where a clean run leaves {expected} (missing)")
    return duplicates, violations


def _check_response(
    campaign: _Campaign,
    scope: str,
    stored: StoredResponse,
    recovered: FlowResult | WorkerResult | None,
    *,
    errored: bool,
) -> list[str]:
    # The stored response is the clean run's, the recovering run answered it, and
    # every later retry replays it.
    violations: list[str] = []
    expected = campaign.clean.response.status
    if not errored and stored.status != expected:
        violations.append(f"stored status {stored.status}, where a clean run answers {expected}")
    if recovered is not None and recovered.stored and recovered.response != stored:
        violations.append("the recovering run answered something else than it stored")
    target = campaign.target
    for n in range(campaign.replays):
        again = target.flow.run(campaign.store, target.request(scope, _KEY))
        if again.kind is not ResultKind.REPLAYED or again.response != stored:
            violations.append(
                f"later retry #{n + 1} got {again.kind.value} "
                f"{again.response.status if again.response else None}, not a replay of "
                f"the stored {stored.status}"
            )
    return violations


def _state(record: KeyRecord) -> KeyState:
    # The key's state (F5) without a clock: expiry does not matter here.
    if record.finished:
        if record.error is not None:
            return KeyState.ERRORED
        failed = record.response is None or record.response.status >= 400
        return KeyState.FAILED if failed else KeyState.COMPLETE
    return KeyState.PROCESSING if record.locked_at else KeyState.PENDING


def _resume(target: Target, store: Store, scope: str, key: str) -> FlowResult:
    # The completer's move: resume the key from what it stored, not from the client.
    record = store.get(scope, key)
    if record is None:  # killed before its claim committed: only a client can retry
        return target.flow.run(store, target.request(scope, key))
    return target.flow.run(store, target.flow.resume_request(record))
