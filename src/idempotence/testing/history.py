"""A history checker: record what clients saw and what happened, then judge it.

Point a load of retried requests at an endpoint while something breaks (a partition, a
killed database, a failover), record every attempt's answer and every side effect in a
[`History`][idempotence.testing.history.History], and
[`History.check`][idempotence.testing.history.History.check] tells whether the promises
held:

* **no duplicate effect**: each key caused at most one effect of each kind, and exactly
  one when the client was told the operation succeeded (a 2xx);
* **answers replayed identically**: once a client got a final answer for a key (any
  status but the transient ones: 409, 429, 5xx, or no answer at all), every final
  answer for that key has the same status and body;
* **no lost answer**: a key whose final answer was acknowledged is finished in the
  store, with that status (give the store's records to
  [`History.check`][idempotence.testing.history.History.check]);
* **everything settles**: every key got its final answer, and a key sent before the
  fault healed got it within the bound you give after the heal (the lock timeout plus
  a heartbeat interval: a lock left by a worker cut off by the fault has lapsed by
  then);
* **no stale twin**: a retry is told "in progress" (409) only while another attempt of
  the same key may still hold the lock, that is during another attempt or within the
  bound after one ended without a final answer.

Recording is safe from many threads and many asyncio tasks at once (a lock that is
never held across an ``await``). The checker itself is pure: no I/O, no clock of its
own, so a hand-made history makes a unit test.

Example:
    ```python
    import time
    import httpx
    from idempotence.testing import History

    history = History()
    with httpx.Client(base_url="http://app:8000", timeout=2.0) as client:
        for attempt in range(20):
            with history.operation("order-1") as op:
                response = client.post("/orders", headers={"Idempotency-Key": "order-1"})
                op.answer(response.status_code, response.content)
            if op.final:
                break
            time.sleep(0.2)
    # Your downstream fake records each effect it performed:
    # history.effect("order-1", "charge ch_123")
    report = history.check(records={"order-1": store.get("tenant", "order-1")})
    report.assert_ok()
    ```
"""

from __future__ import annotations

import enum
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..states import KeyRecord

__all__ = [
    "DEFAULT_TRANSIENT",
    "Effect",
    "History",
    "HistoryReport",
    "Operation",
    "Pending",
    "Property",
    "Violation",
]

DEFAULT_TRANSIENT: frozenset[int] = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
"""Statuses that are not an answer to keep: the key is busy (409), the client is told
to slow down (429), or the server or the key store failed (5xx, not stored: R5).
A retry may get a different answer after any of these."""


class Property(enum.Enum):
    """A promise the checker judges, named in each
    [`Violation`][idempotence.testing.history.Violation]."""

    DUPLICATE_EFFECT = "duplicate effect"
    """A key caused more than one effect of one kind."""
    MISSING_EFFECT = "missing effect"
    """A key acknowledged as a success caused no effect of a required kind."""
    REPLAY_MISMATCH = "replay mismatch"
    """Two final answers for one key differ."""
    LOST_ANSWER = "lost answer"
    """A key whose final answer was acknowledged is missing or unfinished in the store,
    or stores another status."""
    UNSETTLED = "unsettled"
    """A key never got a final answer, or got it too long after the fault healed."""
    STALE_TWIN = "stale twin"
    """A retry was told "in progress" while no other attempt could hold the lock."""


@dataclass(frozen=True)
class Operation:
    """One client attempt: its key, its number among the key's attempts, its answer.

    ``status`` is None when no answer came (a timeout, a reset): the outcome is unknown.
    Times are the history's clock (`time.monotonic` by default), in seconds.
    """

    key: str
    attempt: int
    status: int | None
    body: bytes
    started: float
    ended: float


@dataclass(frozen=True)
class Effect:
    """One side effect performed for a key: a charge, an email, a row."""

    key: str
    effect_id: str
    """What identifies this occurrence (a charge id, a message id): shown in reports."""
    kind: str = "effect"
    """Effects of different kinds (``"charge"``, ``"email"``) are counted apart."""
    at: float = 0.0


@dataclass(frozen=True)
class Violation:
    """One broken promise: which, for which key, and what was seen."""

    property: Property
    key: str
    detail: str

    def __str__(self) -> str:
        return f"{self.property.value}: key {self.key!r}: {self.detail}"


@dataclass(frozen=True)
class HistoryReport:
    """What [`History.check`][idempotence.testing.history.History.check] found, with
    counts for a benchmark's report."""

    keys: int
    operations: int
    effects: int
    acknowledged: int
    """Keys whose client got a final answer."""
    unknown: int
    """Attempts that got no answer at all (outcome unknown to the client)."""
    settle_after_heal: float | None
    """The longest time from the heal to a key's first final answer, for keys still
    unsettled when the fault healed (None without a heal time)."""
    violations: tuple[Violation, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.violations

    def count(self, prop: Property) -> int:
        """How many violations of ``prop`` there are."""
        return sum(1 for v in self.violations if v.property is prop)

    def assert_ok(self) -> None:
        """Raise ``AssertionError`` listing every violation, if there is any.

        Raises:
            AssertionError: a promise was broken; the message lists each violation.
        """
        if self.violations:
            raise AssertionError(str(self))

    def __str__(self) -> str:
        settle = (
            ""
            if self.settle_after_heal is None
            else f", settled {self.settle_after_heal:.2f} s after the heal"
        )
        head = (
            f"{self.keys} keys, {self.operations} attempts ({self.unknown} unanswered), "
            f"{self.acknowledged} acknowledged, {self.effects} effects{settle}: "
        )
        if not self.violations:
            return head + "no violation"
        by_kind = Counter(v.property.value for v in self.violations)
        lines = [head + ", ".join(f"{n} {name}" for name, n in sorted(by_kind.items()))]
        lines += [f"  {v}" for v in self.violations]
        return "\n".join(lines)


class Pending:
    """An attempt being recorded by
    [`History.operation`][idempotence.testing.history.History.operation]: give it the
    answer."""

    __slots__ = ("body", "status")

    def __init__(self) -> None:
        self.status: int | None = None
        self.body: bytes = b""

    def answer(self, status: int, body: bytes | str = b"") -> None:
        """Record the answer the client received."""
        self.status = status
        self.body = body.encode() if isinstance(body, str) else bytes(body)

    @property
    def final(self) -> bool:
        """Whether the answer is one to keep (not transient, not missing)."""
        return self.status is not None and self.status not in DEFAULT_TRANSIENT


class History:
    """Every client attempt and every side effect of a run, recorded as they happen.

    Args:
        clock: where times come from (seconds); give all your time stamps, such as the
            heal time, from the same clock. `time.monotonic` by default.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._operations: list[Operation] = []
        self._effects: list[Effect] = []
        self._attempts: Counter[str] = Counter()

    def now(self) -> float:
        """The history's clock, for the heal time given to
        [`check`][idempotence.testing.history.History.check]."""
        return self._clock()

    @property
    def operations(self) -> tuple[Operation, ...]:
        with self._lock:
            return tuple(self._operations)

    @property
    def effects(self) -> tuple[Effect, ...]:
        with self._lock:
            return tuple(self._effects)

    @contextmanager
    def operation(self, key: str) -> Iterator[Pending]:
        """Record one attempt for ``key``: call ``answer()`` on what it yields.

        An attempt that leaves the block without an answer (the request raised, timed
        out, or was cancelled) is recorded as unanswered, and the exception goes on.

        Example:
            ```python
            with history.operation(key) as op:
                response = await client.post(url, headers={"Idempotency-Key": key})
                op.answer(response.status_code, response.content)
            ```
        """
        pending = Pending()
        started = self._clock()
        try:
            yield pending
        finally:
            self.record(key, pending.status, pending.body, started=started, ended=self._clock())

    def record(
        self,
        key: str,
        status: int | None,
        body: bytes = b"",
        *,
        started: float,
        ended: float,
    ) -> Operation:
        """Record an attempt whose times you measured yourself; numbered per key.

        Args:
            key: the Idempotency-Key sent.
            status: the status received, or None when no answer came.
            body: the body received.
            started: when the request was sent (the history's clock).
            ended: when the answer came, or the attempt gave up.

        Returns:
            The recorded operation.

        Raises:
            ValueError: ``ended`` is before ``started``.
        """
        if ended < started:
            raise ValueError(f"an attempt cannot end ({ended}) before it starts ({started})")
        with self._lock:
            self._attempts[key] += 1
            op = Operation(key, self._attempts[key], status, bytes(body), started, ended)
            self._operations.append(op)
        return op

    def effect(self, key: str, effect_id: str, kind: str = "effect") -> Effect:
        """Record a side effect performed for ``key`` (call it where the effect lands:
        in the downstream fake, the provider's webhook, the outbox consumer)."""
        done = Effect(key, effect_id, kind, self._clock())
        with self._lock:
            self._effects.append(done)
        return done

    def check(
        self,
        *,
        records: Mapping[str, KeyRecord | None] | None = None,
        healed_at: float | None = None,
        settle_within: float | None = None,
        required_effects: Collection[str] = ("effect",),
        transient: Collection[int] = DEFAULT_TRANSIENT,
    ) -> HistoryReport:
        """Judge the history; see the module's documentation for the promises.

        Args:
            records: the store's record of each key, read after the run
                (``store.get(scope, key)``), or None to skip the store checks. A key
                missing from the mapping is not checked against the store.
            healed_at: when the last fault healed (the history's clock).
            settle_within: the bound, in seconds, on the time from the heal to a key's
                first final answer, and on how long after an unanswered attempt a 409
                is still excused: the lock timeout plus one heartbeat interval. None
                skips both timing checks.
            required_effects: the kinds of effect a successful key must have caused
                exactly once.
            transient: the statuses that are no final answer.

        Returns:
            The report;
            [`HistoryReport.assert_ok`][idempotence.testing.history.HistoryReport.assert_ok]
            raises if anything broke.
        """
        operations, effects = self.operations, self.effects
        by_key: dict[str, list[Operation]] = defaultdict(list)
        for op in operations:
            by_key[op.key].append(op)
        effects_by_key: dict[str, list[Effect]] = defaultdict(list)
        for done in effects:
            effects_by_key[done.key].append(done)
        keys = sorted(set(by_key) | set(effects_by_key))
        violations: list[Violation] = []
        settle_times: list[float] = []
        transient = frozenset(transient)
        for key in keys:
            ops = sorted(by_key.get(key, ()), key=lambda op: (op.ended, op.attempt))
            finals = [op for op in ops if op.status is not None and op.status not in transient]
            violations += _effect_violations(
                key, finals, effects_by_key.get(key, []), required_effects
            )
            violations += _replay_violations(key, finals)
            if records is not None and key in records and finals:
                violations += _store_violations(key, finals[0], records[key])
            if ops:
                settled = _settle_violations(key, ops, finals, healed_at, settle_within)
                violations += settled[0]
                if settled[1] is not None:
                    settle_times.append(settled[1])
                if settle_within is not None:
                    violations += _stale_twins(key, ops, transient, settle_within)
        return HistoryReport(
            keys=len(keys),
            operations=len(operations),
            effects=len(effects),
            acknowledged=sum(
                1
                for ops in by_key.values()
                if any(op.status is not None and op.status not in transient for op in ops)
            ),
            unknown=sum(1 for op in operations if op.status is None),
            settle_after_heal=max(settle_times, default=0.0) if healed_at is not None else None,
            violations=tuple(violations),
        )


# -- the properties, one function each: pure, over one key's history ------------------


def _effect_violations(
    key: str, finals: list[Operation], effects: list[Effect], required: Collection[str]
) -> list[Violation]:
    found: list[Violation] = []
    kinds: dict[str, list[str]] = defaultdict(list)
    for done in effects:
        kinds[done.kind].append(done.effect_id)
    for kind, ids in sorted(kinds.items()):
        if len(ids) > 1:
            found.append(
                Violation(
                    Property.DUPLICATE_EFFECT,
                    key,
                    f"{len(ids)} effects of kind {kind!r}: {', '.join(ids)}",
                )
            )
    if any(200 <= op.status < 300 for op in finals if op.status is not None):
        for kind in required:
            if kind not in kinds:
                found.append(
                    Violation(
                        Property.MISSING_EFFECT,
                        key,
                        f"acknowledged as a success, but no {kind!r} effect",
                    )
                )
    return found


def _replay_violations(key: str, finals: list[Operation]) -> list[Violation]:
    if not finals:
        return []
    first = finals[0]
    return [
        Violation(
            Property.REPLAY_MISMATCH,
            key,
            f"attempt {op.attempt} got {op.status} {_excerpt(op.body)}, "
            f"attempt {first.attempt} had got {first.status} {_excerpt(first.body)}",
        )
        for op in finals[1:]
        if (op.status, op.body) != (first.status, first.body)
    ]


def _store_violations(key: str, first: Operation, record: KeyRecord | None) -> list[Violation]:
    if record is None:
        problem = "the store has no record of it"
    elif not record.finished:
        problem = f"the store has it unfinished at {record.recovery_point!r}"
    elif record.response is not None and record.response.status != first.status:
        problem = f"the store holds status {record.response.status}"
    else:
        return []
    return [
        Violation(
            Property.LOST_ANSWER,
            key,
            f"attempt {first.attempt} was answered {first.status}, but {problem}",
        )
    ]


def _settle_violations(
    key: str,
    ops: list[Operation],
    finals: list[Operation],
    healed_at: float | None,
    bound: float | None,
) -> tuple[list[Violation], float | None]:
    if not finals:
        return [Violation(Property.UNSETTLED, key, f"no final answer in {len(ops)} attempts")], None
    first = finals[0]
    # Only a key the fault could touch: one with an attempt begun before the heal.
    # A key first sent afterwards owes the heal nothing.
    if healed_at is None or first.ended <= healed_at or min(op.started for op in ops) > healed_at:
        return [], None
    took = first.ended - healed_at
    if bound is not None and took > bound:
        detail = f"first final answer {took:.2f} s after the heal (bound {bound:.2f} s)"
        return [Violation(Property.UNSETTLED, key, detail)], took
    return [], took


def _stale_twins(
    key: str, ops: list[Operation], transient: frozenset[int], window: float
) -> list[Violation]:
    found: list[Violation] = []
    for op in ops:
        if op.status != 409:
            continue
        excused = any(
            # Another attempt that may hold the lock: one in flight at the same time,
            # or one that ended without a final answer (no answer, or the server
            # failed: its claim may have committed) within the window. A 409 holds
            # nothing, so it excuses nothing.
            other is not op
            and other.status != 409
            and other.started <= op.ended
            and (
                other.ended >= op.started
                or (
                    (other.status is None or other.status in transient)
                    and op.started - other.ended <= window
                )
            )
            for other in ops
        )
        if not excused:
            found.append(
                Violation(
                    Property.STALE_TWIN,
                    key,
                    f"attempt {op.attempt} was told 409 {_excerpt(op.body, 240)} with no other "
                    f"attempt in flight or unanswered within {window:.2f} s",
                )
            )
    return found


def _excerpt(body: bytes, limit: int = 60) -> str:
    text = body[:limit].decode("utf-8", "replace")
    return repr(text + ("…" if len(body) > limit else ""))
