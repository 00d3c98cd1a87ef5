"""The maintenance operations, written once, without I/O (see `stores._sql.ops`).

Each is a generator of named queries from the ``maintenance`` section of the
dialect's ``queries.sql``; a store runs it with its private ``_perform``, which hands
it the dialect. The writes start with `statement_timeout`, so they run in a
transaction of their own (``_perform(..., write=True)``) where the timeout is local.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..states import KeyRecord, KeyState, StagedJob, StoredResponse
from ..stores._sql.ops import Dialect, Op


@dataclass(frozen=True, slots=True)
class DbTime:
    """A moment on the database clock: as the database wrote it, and as a datetime."""

    raw: Any
    at: datetime


@dataclass(frozen=True, slots=True)
class SweptKey:
    """A key whose expired lock the sweeper released (B1)."""

    id: int
    scope: str
    key: str
    flow: str
    recovery_point: str
    lock_token: int
    """The new fencing token: the crashed holder's token is now stale."""
    held_since: datetime | None
    """When the crashed holder took or last renewed the lock (PostgreSQL only)."""


@dataclass(frozen=True, slots=True)
class PickedKey:
    """An abandoned key the completer took for a resume (B2)."""

    record: KeyRecord
    attempts: int
    """Completer attempts including this one."""


@dataclass(frozen=True, slots=True)
class ExpiredKey:
    """A pending key the reaper turned into a stored 408 (B3)."""

    id: int
    scope: str
    key: str
    flow: str


@dataclass(frozen=True, slots=True)
class Job(StagedJob):
    """A job of the built-in runner, as its function receives it (B4): the fields
    of the `StagedJob` it was delivered from (``id`` and
    ``created_at`` are its row's in the runner's table), and its attempt.

    ``job_key`` is the same on every attempt: use it to deduplicate the job's own
    side effects (pass it as the idempotency key of the email provider's call).
    """

    attempt: int
    """1 on the first attempt."""


@dataclass(frozen=True, slots=True)
class KeyRow:
    """A key as the operator sees it: its record, state (F5) and completer attempts."""

    record: KeyRecord
    state: KeyState
    now: datetime
    """The database clock when the row was read; ``state`` is the state at that moment."""
    completer_attempts: int


@dataclass(frozen=True, slots=True)
class StateCount:
    state: KeyState
    keys: int
    oldest: datetime
    takeovers: int


def _names(names: Iterable[str]) -> str:
    # Both dialects take a list of names as a JSON array (jsonb_array_elements_text,
    # json_each): one parameter shape, and no array adaptation to differ.
    return json.dumps(sorted(set(names)))


def statement_timeout(d: Dialect, seconds: float | None) -> Op[None]:
    """Bound each following statement of the transaction (PostgreSQL; a no-op on
    SQLite, which has none)."""
    if seconds is not None:
        yield d.query("maintenance_timeout", timeout_ms=max(int(seconds * 1000), 1))


def db_now(d: Dialect) -> Op[DbTime]:
    rows = yield d.query("db_now")
    raw = rows[0]["db_now"]
    return DbTime(raw, d.timestamp(raw))


def sweep(d: Dialect, limit: int, timeout: float | None) -> Op[list[SweptKey]]:
    """Release up to ``limit`` expired locks, bumping each fencing token (B1, F1)."""
    yield from statement_timeout(d, timeout)
    rows = yield d.query("sweep_expired_locks", limit=limit)
    swept = [
        SweptKey(
            id=row["id"],
            scope=row["scope"],
            key=row["key"],
            flow=row["flow"],
            recovery_point=row["recovery_point"],
            lock_token=row["lock_token"],
            held_since=d.optional_timestamp(row["held_since"]),
        )
        for row in rows
    ]
    return sorted(swept, key=lambda k: k.id)


def pick_abandoned(
    d: Dialect,
    flows: Sequence[str],
    since: DbTime,
    grace: timedelta,
    limit: int,
    timeout: float | None,
) -> Op[list[PickedKey]]:
    """Take up to ``limit`` abandoned keys of ``flows`` for the completer (B2)."""
    yield from statement_timeout(d, timeout)
    rows = yield d.query(
        "pick_abandoned",
        flows=_names(flows),
        since=since.raw,
        grace=d.duration_in(grace),
        limit=limit,
    )
    picked = [PickedKey(d.record(row), row["completer_attempts"]) for row in rows]
    return sorted(picked, key=lambda p: p.record.id)


def reset_completer_attempts(d: Dialect, scope: str, key: str, key_id: int) -> Op[None]:
    """Start a key's completer attempts again: its flow made progress (B2)."""
    yield d.query("reset_completer_attempts", scope=scope, key=key, id=key_id)


def abandoned_unregistered(
    d: Dialect, flows: Sequence[str], since: DbTime, grace: timedelta, timeout: float | None
) -> Op[dict[str, int]]:
    """Abandoned keys whose flow is not in ``flows``, counted per flow (B2)."""
    yield from statement_timeout(d, timeout)
    rows = yield d.query(
        "abandoned_unregistered", flows=_names(flows), since=since.raw, grace=d.duration_in(grace)
    )
    return {row["flow"]: int(row["keys"]) for row in rows}


def expire_pending(
    d: Dialect, response: StoredResponse, limit: int, timeout: float | None
) -> Op[list[ExpiredKey]]:
    """Store ``response`` on up to ``limit`` pending keys past expiry (B3)."""
    yield from statement_timeout(d, timeout)
    rows = yield d.query(
        "expire_pending",
        status=response.status,
        headers=json.dumps([list(pair) for pair in response.headers]),
        body=response.body,
        limit=limit,
    )
    expired = [ExpiredKey(row["id"], row["scope"], row["key"], row["flow"]) for row in rows]
    return sorted(expired, key=lambda k: k.id)


def reap(d: Dialect, limit: int, timeout: float | None) -> Op[int]:
    """Delete up to ``limit`` finished, unerrored keys past expiry; return how many (B3)."""
    yield from statement_timeout(d, timeout)
    rows = yield d.query("reap_finished", limit=limit)
    # PostgreSQL returns one row holding the count, SQLite a row of 1 per deleted key.
    return sum(int(row["deleted"]) for row in rows)


def deliver_jobs(d: Dialect, jobs: Sequence[StagedJob]) -> Op[list[str]]:
    """Insert ``jobs`` into the built-in runner's table in the caller's transaction;
    return the job keys that were new (B4: a repeated job_key is absorbed)."""
    new = []
    for job in jobs:
        rows = yield d.query(
            "deliver_job",
            job_key=job.job_key,
            scope=job.scope,
            key_id=job.key_id,
            name=job.name,
            args=json.dumps(job.args, separators=(",", ":")),
        )
        if rows:
            new.append(job.job_key)
    return new


def pick_jobs(
    d: Dialect, names: Sequence[str], lease: timedelta, limit: int, timeout: float | None
) -> Op[list[Job]]:
    """Take up to ``limit`` due jobs of ``names`` for ``lease`` (B4)."""
    yield from statement_timeout(d, timeout)
    rows = yield d.query("pick_jobs", names=_names(names), lease=d.duration_in(lease), limit=limit)
    jobs = [
        Job(
            id=row["id"],
            job_key=row["job_key"],
            scope=row["scope"],
            key_id=row["key_id"],
            name=row["name"],
            args=d.json_out(row["args"]),
            attempt=row["attempts"],
            created_at=d.timestamp(row["created_at"]),
        )
        for row in rows
    ]
    return sorted(jobs, key=lambda j: j.id)


def job_done(d: Dialect, job: Job, timeout: float | None) -> Op[bool]:
    """Mark ``job`` done; False when another runner has picked it again since."""
    yield from statement_timeout(d, timeout)
    rows = yield d.query("job_done", id=job.id, attempts=job.attempt)
    return bool(rows)


def job_failed(
    d: Dialect,
    job: Job,
    error: str,
    backoff: timedelta,
    max_attempts: int,
    timeout: float | None,
) -> Op[str | None]:
    """Record a failed attempt: ``'ready'`` (retried after ``backoff``), ``'dead'``, or
    None when another runner has picked the job again since."""
    yield from statement_timeout(d, timeout)
    rows = yield d.query(
        "job_failed",
        id=job.id,
        attempts=job.attempt,
        error=error,
        backoff=d.duration_in(backoff),
        max_attempts=max_attempts,
    )
    return str(rows[0]["status"]) if rows else None


def list_keys(
    d: Dialect,
    *,
    state: KeyState | None,
    scope: str | None,
    key: str | None,
    limit: int,
) -> Op[list[KeyRow]]:
    """Keys with their state, newest first; filtered in SQL before the limit (F5)."""
    rows = yield d.query(
        "list_keys",
        state=None if state is None else state.value,
        scope=scope,
        key=key,
        limit=limit,
    )
    return [
        KeyRow(
            record=d.record(row),
            state=KeyState(row["state"]),
            now=d.timestamp(row["db_now"]),
            completer_attempts=row["completer_attempts"],
        )
        for row in rows
    ]


def key_stats(d: Dialect, scope: str | None = None) -> Op[tuple[DbTime, list[StateCount]]]:
    """Keys per state, the oldest of each, and the lock takeovers (F5), of one
    ``scope`` if given (a consumer's)."""
    now = yield from db_now(d)
    rows = yield d.query("key_stats", scope=scope)
    counts = [
        StateCount(
            state=KeyState(row["state"]),
            keys=int(row["keys"]),
            oldest=d.timestamp(row["oldest"]),
            takeovers=int(row["takeovers"] or 0),
        )
        for row in rows
    ]
    return now, counts


def job_stats(d: Dialect) -> Op[dict[str, int]]:
    rows = yield d.query("job_stats")
    return {row["status"]: int(row["jobs"]) for row in rows}


def evict(d: Dialect, scope: str, key: str, id: int, force: bool) -> Op[bool]:
    """Delete one key's row ``id`` unless a live lock protects it (or ``force``); True
    if deleted."""
    rows = yield d.query("evict_key", scope=scope, key=key, id=id, force=force)
    return bool(rows)
