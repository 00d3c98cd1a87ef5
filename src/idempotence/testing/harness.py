"""The crash-injection harness: kill a flow at every boundary and prove it recovers (F4).

Point it at a flow of your own. The harness runs the flow once, cleanly, in a child
process, to learn its boundaries (the events of :class:`~idempotence.flows.Observer`:
before and after each phase commits, around each foreign call, and whatever your
downstream fakes report, such as the provider's own commit). Then, for every
boundary, it runs the flow in a fresh child that SIGKILLs itself exactly there, and
recovers the key twice over, separately:

* **retry**: the client retries with the same key, in another fresh process;
* **resume**: the key is left alone until its lock expires, then resumed from its
  stored parameters, as the completer does (``flow.run(store, flow.resume_request(record))``).

After each recovery it asserts what exactly-once means: the key reached a terminal
state; no downstream effect and no local row exists twice (the target's *census*
never counts more than a clean run left behind, nor less unless the key is errored,
R6); the response is the clean run's; and every later retry replays it byte for
byte. It returns a :class:`CrashReport` and raises ``AssertionError`` listing every
violation.

The flow is named by an importable ``"module:function"`` factory, so each child can
build it; the factory takes a JSON-able config and returns a :class:`Target`::

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

import base64
import enum
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..flows import Flow, FlowResult, Observer, ResultKind
from ..states import ClaimRequest, KeyRecord, KeyState, StoredResponse
from ..stores import AsyncStore, Store

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

Flavour = Literal["sync", "async"]


def _uninstrumented(observer: Observer) -> None:
    pass


@dataclass(frozen=True)
class Target:
    """A flow under test, and what the harness needs to drive and judge it."""

    flow: Flow
    #: Open the key store (each process opens its own).
    open_store: Callable[[], Store]
    #: The request to run for ``(scope, key)``; the same arguments give the same request.
    request: Callable[[str, str], ClaimRequest]
    #: Named counts of what the run of ``record`` left behind: local rows, downstream
    #: effects. A recovered run must never count more than a clean run.
    census: Callable[[Store, KeyRecord], Mapping[str, int]]
    #: Wire the downstream fakes' own boundaries (a provider's commit) to ``observer``,
    #: so the harness can kill inside a foreign call too.
    instrument: Callable[[Observer], None] = _uninstrumented
    #: Open the async key store, for ``flavour="async"`` runs.
    open_async_store: Callable[[], AsyncStore] | None = None


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

#: Results that end a client's retries: the answer is final.
FINAL = frozenset(
    {
        ResultKind.EXECUTED,
        ResultKind.REPLAYED,
        ResultKind.ERRORED,
        ResultKind.REJECTED,
        ResultKind.MISMATCH,
    }
)


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


# -- workers: one run of the flow in a child process --------------------------------------


@dataclass(frozen=True, order=True)
class KillPoint:
    """A boundary to kill at: the ``occurrence``-th time ``event`` is seen in a run."""

    event: str
    occurrence: int = 1

    def __str__(self) -> str:
        return self.event if self.occurrence == 1 else f"{self.event} (#{self.occurrence})"


@dataclass(frozen=True)
class WorkerResult:
    """How a worker's run ended (what the child reported)."""

    kind: ResultKind
    response: StoredResponse | None
    stored: bool
    error: str | None
    attempts: int


class Worker:
    """A child process running the target's flow once (or until final, ``retry``).

    Build it with :func:`spawn_worker`. The child kills itself with SIGKILL at
    ``kill_at`` (exactly as a ``kill -9`` would, at an exact point), or stops itself
    with SIGSTOP at ``stop_at`` until :meth:`resume` (a zombie: a worker frozen by a GC
    pause or a partition that wakes up later).
    """

    def __init__(self, spec: dict[str, Any], workdir: Path) -> None:
        self.spec = spec
        self._spec_path = workdir / "spec.json"
        self._spec_path.write_text(json.dumps(spec))
        self._stderr_path = workdir / "stderr.txt"
        env = dict(os.environ)
        # The child imports the factory's module the way this process does.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        with self._stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "idempotence.testing._child", str(self._spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                env=env,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for the child to exit; kill it if it outlives ``timeout``."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    @property
    def killed(self) -> bool:
        """Whether the child died of SIGKILL."""
        return self.process.returncode == -signal.SIGKILL

    def events(self) -> list[KillPoint]:
        """The boundaries the child crossed, in order."""
        path = Path(self.spec["events"])
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        return [KillPoint(*json.loads(line)) for line in lines if line.strip()]

    def result(self) -> WorkerResult | None:
        """The child's result, or None if it died before reporting one."""
        path = Path(self.spec["result"])
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        response = None
        if data["status"] is not None:
            response = StoredResponse(
                status=data["status"],
                headers=tuple((str(k), str(v)) for k, v in data["headers"]),
                body=base64.b64decode(data["body"]),
            )
        return WorkerResult(
            kind=ResultKind(data["kind"]),
            response=response,
            stored=data["stored"],
            error=data["error"],
            attempts=data["attempts"],
        )

    def stderr(self) -> str:
        return self._stderr_path.read_text(errors="replace")

    def wait_stopped(self, timeout: float = 30.0) -> None:
        """Wait until the child has stopped itself at ``stop_at``."""
        stop = KillPoint(*self.spec["stop_at"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the worker exited ({self.process.returncode}) instead of stopping at "
                    f"{stop}:\n{self.stderr()}"
                )
            if stop in self.events() and _is_stopped(self.pid):
                return
            time.sleep(0.01)
        raise TimeoutError(f"the worker did not stop at {stop} within {timeout} s")

    def resume(self) -> None:
        """Wake a stopped child (SIGCONT)."""
        os.kill(self.pid, signal.SIGCONT)


def _is_stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:  # not Linux: the event was written just before the stop
        time.sleep(0.2)
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def spawn_worker(
    factory: str,
    config: Mapping[str, Any],
    *,
    scope: str,
    key: str,
    workdir: str | os.PathLike[str],
    kill_at: KillPoint | None = None,
    stop_at: KillPoint | None = None,
    retry: bool = False,
    flavour: Flavour = "sync",
    timeout: float = 60.0,
) -> Worker:
    """Start a child process that runs the target's flow for ``(scope, key)``.

    ``retry`` makes the child retry until the answer is final (:func:`settle`);
    ``workdir`` (an empty directory) receives the child's spec, events and result.
    """
    folder = Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        "factory": factory,
        "config": dict(config),
        "scope": scope,
        "key": key,
        "kill_at": None if kill_at is None else [kill_at.event, kill_at.occurrence],
        "stop_at": None if stop_at is None else [stop_at.event, stop_at.occurrence],
        "retry": retry,
        "flavour": flavour,
        "timeout": timeout,
        "events": str(folder / "events.jsonl"),
        "result": str(folder / "result.json"),
    }
    return Worker(spec, folder)


# -- the report ---------------------------------------------------------------------------


class Recovery(enum.Enum):
    """How a killed run's key is recovered."""

    #: The client retries with the same key, from a fresh process.
    RETRY = "retry"
    #: The key is resumed from its stored parameters once its lock expires (B2).
    RESUME = "resume"


@dataclass(frozen=True)
class KillResult:
    """One kill and one recovery."""

    point: KillPoint
    recovery: Recovery
    #: Whether the worker was killed at ``point`` (False: the run never got there).
    killed: bool
    #: The key's state after the recovery (None: the key is gone).
    state: KeyState | None
    #: The stored response's status.
    status: int | None
    #: Runs the recovery took.
    attempts: int
    #: ``{census name: (clean run's count, this run's count)}`` where this run has more.
    duplicates: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    violations: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass(frozen=True)
class CrashReport:
    """What :func:`crash_test` found: the clean run, and one row per kill and recovery."""

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

            # The clean run: its boundaries are the kill points, its census the norm.
            survey = spawn_worker(
                factory,
                config,
                scope=f"{prefix}-clean",
                key="k",
                workdir=workdir / "clean",
                flavour=flavour,
                timeout=timeout,
            )
            survey.wait(timeout)
            clean = survey.result()
            record = store.get(f"{prefix}-clean", "k")
            if clean is None or clean.kind is not ResultKind.EXECUTED or record is None:
                raise AssertionError(
                    f"the clean run of {factory} did not finish: "
                    f"{clean or 'no result'}\n{survey.stderr()}"
                )
            assert clean.response is not None
            baseline_response = clean.response
            baseline = dict(target.census(store, record))
            points = tuple(p for p in survey.events() if select is None or select(p))

            def one(job: tuple[int, KillPoint, Recovery]) -> KillResult:
                n, point, recovery = job
                return _kill_and_recover(
                    factory,
                    config,
                    target,
                    store,
                    point,
                    recovery,
                    scope=f"{prefix}-{n}-{recovery.value}",
                    workdir=workdir / f"{n}-{recovery.value}",
                    flavour=flavour,
                    baseline=baseline,
                    baseline_response=baseline_response,
                    replays=replays,
                    timeout=timeout,
                )

            jobs = [(n, p, r) for n, p in enumerate(points) for r in recoveries]
            with ThreadPoolExecutor(max(parallel, 1)) as pool:
                results = tuple(pool.map(one, jobs))
    finally:
        store.close()
    report = CrashReport(
        factory=factory,
        baseline_status=baseline_response.status,
        baseline_census=baseline,
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


def _kill_and_recover(
    factory: str,
    config: Mapping[str, Any],
    target: Target,
    store: Store,
    point: KillPoint,
    recovery: Recovery,
    *,
    scope: str,
    workdir: Path,
    flavour: Flavour,
    baseline: Mapping[str, int],
    baseline_response: StoredResponse,
    replays: int,
    timeout: float,
) -> KillResult:
    key = "k"
    victim = spawn_worker(
        factory,
        config,
        scope=scope,
        key=key,
        workdir=workdir / "killed",
        kill_at=point,
        flavour=flavour,
        timeout=timeout,
    )
    victim.wait(timeout)
    violations: list[str] = []
    if not victim.killed and victim.result() is None:
        violations.append(f"the worker failed instead of being killed:\n{victim.stderr()}")

    recovered: FlowResult | WorkerResult | None
    if recovery is Recovery.RETRY:
        retry = spawn_worker(
            factory,
            config,
            scope=scope,
            key=key,
            workdir=workdir / "retry",
            retry=True,
            flavour=flavour,
            timeout=timeout,
        )
        retry.wait(timeout + 10)
        recovered = retry.result()
        attempts = recovered.attempts if recovered is not None else 0
        if recovered is None:
            violations.append(f"the retrying worker failed:\n{retry.stderr()}")
    else:
        recovered, attempts = settle(lambda: _resume(target, store, scope, key), timeout=timeout)

    record = store.get(scope, key)
    duplicates: dict[str, tuple[int, int]] = {}
    if record is None:
        violations.append("the key is gone: nothing records what was done")
        return KillResult(
            point, recovery, victim.killed, None, None, attempts, {}, tuple(violations)
        )
    state = _state(record)
    stored = record.response
    if not record.finished or stored is None:
        violations.append(
            f"no terminal state: the key is {state.value} at {record.recovery_point!r} after "
            f"{attempts} attempt(s)"
        )
    errored = record.error is not None

    census = dict(target.census(store, record))
    for name in sorted(set(census) | set(baseline)):
        expected, found = baseline.get(name, 0), census.get(name, 0)
        if found > expected:
            duplicates[name] = (expected, found)
            violations.append(f"{name}: {found} where a clean run leaves {expected} (duplicate)")
        elif found < expected and not errored:
            violations.append(f"{name}: {found} where a clean run leaves {expected} (missing)")

    if stored is not None:
        if not errored and stored.status != baseline_response.status:
            violations.append(
                f"stored status {stored.status}, where a clean run answers "
                f"{baseline_response.status}"
            )
        if recovered is not None and recovered.stored and recovered.response != stored:
            violations.append("the recovering run answered something else than it stored")
        for n in range(replays):
            again = target.flow.run(store, target.request(scope, key))
            if again.kind is not ResultKind.REPLAYED or again.response != stored:
                violations.append(
                    f"later retry #{n + 1} got {again.kind.value} "
                    f"{again.response.status if again.response else None}, not a replay of "
                    f"the stored {stored.status}"
                )
    return KillResult(
        point,
        recovery,
        victim.killed,
        state,
        stored.status if stored is not None else None,
        attempts,
        duplicates,
        tuple(violations),
    )


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
