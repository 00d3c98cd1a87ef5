"""Group commit on SQLite: the store's own autocommit writes that queue while a commit
is in flight go in one transaction, each in a savepoint of its own (DESIGN 8).

What must hold, tried against real database files: concurrent duplicates still
execute once (P6); a zombie's write inside a group is refused (F1) while the others
in the group commit; an operation that fails inside a group fails alone; no caller is
told "done" for a write that is not on disk (a SIGKILL mid-group loses only writes
nobody was told of); grouping happens under load, and a lone write commits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import multiprocessing
import os
import random
import signal
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from idempotence import (
    AsyncSqliteStore,
    ClaimRequest,
    Outcome,
    SqliteStore,
    StoredResponse,
)
from idempotence.errors import LockLost, StoreError, StoreUnavailable
from idempotence.stores._sql.ops import Dialect, Op
from idempotence.stores.sqlite import _store as sqlite_module
from idempotence.stores.sqlite import _store_shared as _sqlite_base
from idempotence.stores.sqlite._group import Groups

CONCURRENCY = 32
KEYS = 200
FP = "f" * 64
SHORT = timedelta(milliseconds=200)


def request(scope: str, key: str, **kw: Any) -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint=FP, **kw)


def response(key: str) -> StoredResponse:
    return StoredResponse.of(201, body=f"done {key}")


class Commits:
    """Counts, from sqlite3's trace callback on every connection the store opens, the
    transactions that commit (a COMMIT, or a write run outside a transaction) and the
    writes that ran inside a group (its per-write savepoints)."""

    def __init__(self) -> None:
        self.commits = 0
        self.grouped = 0
        self._lock = threading.Lock()
        self._connect = sqlite_module.connect

    def connect(self, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        raw = self._connect(*args, **kwargs)

        def trace(sql: str) -> None:
            first = sql.lstrip().split(None, 1)[0].upper()
            with self._lock:
                if first == "COMMIT" or (
                    first in ("INSERT", "UPDATE", "DELETE") and not raw.in_transaction
                ):
                    self.commits += 1
                if sql.startswith("SAVEPOINT idempotence_group"):
                    self.grouped += 1

        raw.set_trace_callback(trace)
        return raw


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> Commits:
    counter = Commits()
    monkeypatch.setattr(sqlite_module, "connect", counter.connect)
    return counter


def _outcome_table(outcomes: list[tuple[str, str]]) -> dict[str, Counter[str]]:
    table: dict[str, Counter[str]] = {}
    for key, outcome in outcomes:
        table.setdefault(key, Counter())[outcome] += 1
    return table


def _assert_one_execution_each(outcomes: list[tuple[str, str]]) -> None:
    table = _outcome_table(outcomes)
    assert len(table) == KEYS
    bad = {key: dict(c) for key, c in table.items() if c["execute"] != 1}
    assert not bad, f"keys without exactly one EXECUTE: {bad}"
    assert sum(sum(c.values()) for c in table.values()) == CONCURRENCY * KEYS


def _assert_all_finished(path: str, scope: str) -> None:
    with SqliteStore(path) as store:
        for n in range(KEYS):
            record = store.get(scope, f"k{n}")
            assert record is not None and record.response is not None, n
            assert record.response.body == f"done k{n}".encode()


# -- P6 under grouping: 32 claimers x 200 keys ---------------------------------------------


@pytest.mark.slow
def test_p6_32_threads_claim_200_keys_one_execution_each_and_commits_are_grouped(
    sqlite_path: str, scope: str, commits: Commits
) -> None:
    """Every thread claims every key (each in its own order) and finishes the ones it
    wins: the claims and finishes that meet in one group still execute each key once."""
    outcomes: list[tuple[str, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CONCURRENCY)
    with SqliteStore(sqlite_path) as store:

        def worker(seed: int) -> None:
            keys = [f"k{n}" for n in range(KEYS)]
            random.Random(seed).shuffle(keys)
            barrier.wait()
            for key in keys:
                claim = store.claim(request(scope, key))
                if claim.outcome is Outcome.EXECUTE:
                    store.finish(claim.lease, response(key))
                with lock:
                    outcomes.append((key, claim.outcome.value))

        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(worker, range(CONCURRENCY)))
    _assert_one_execution_each(outcomes)
    _assert_all_finished(sqlite_path, scope)
    # 200 claims that wrote and 200 finishes, and far fewer commits.
    assert commits.grouped > 0
    assert commits.commits < 2 * KEYS


@pytest.mark.slow
def test_p6_32_tasks_claim_200_keys_one_execution_each_and_commits_are_grouped(
    sqlite_path: str, scope: str, commits: Commits
) -> None:
    outcomes: list[tuple[str, str]] = []

    async def main() -> None:
        store = AsyncSqliteStore(sqlite_path)
        start = asyncio.Event()

        async def worker(seed: int) -> None:
            keys = [f"k{n}" for n in range(KEYS)]
            random.Random(seed).shuffle(keys)
            await start.wait()
            for key in keys:
                claim = await store.claim(request(scope, key))
                if claim.outcome is Outcome.EXECUTE:
                    await store.finish(claim.lease, response(key))
                outcomes.append((key, claim.outcome.value))

        try:
            tasks = [asyncio.create_task(worker(seed)) for seed in range(CONCURRENCY)]
            await asyncio.sleep(0)
            start.set()
            await asyncio.gather(*tasks)
        finally:
            await store.close()

    asyncio.run(main())
    _assert_one_execution_each(outcomes)
    _assert_all_finished(sqlite_path, scope)
    assert commits.grouped > 0
    assert commits.commits < 2 * KEYS


# -- one group, one failure -------------------------------------------------------------


@pytest.fixture
def write_lock(sqlite_path: str) -> Iterator[Callable[[], Callable[[], None]]]:
    """Take SQLite's write lock on another connection; the function returned lets it
    go. Held, the store's first write waits for it, and the writes behind it queue."""
    other = sqlite3.connect(sqlite_path, isolation_level=None)

    def hold() -> Callable[[], None]:
        other.execute("BEGIN IMMEDIATE")
        return lambda: other.execute("COMMIT")

    yield hold
    if other.in_transaction:
        other.execute("ROLLBACK")
    other.close()


def committing(groups: Groups[Any]) -> bool:
    """Whether a commit is under way with nothing queued: its group is taken, and a
    write arriving now waits for the next."""
    return groups._busy and len(groups) == 0


def until(condition: Callable[[], bool], failure: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.001)


async def until_async(condition: Callable[[], bool], failure: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, failure
        await asyncio.sleep(0.001)


def _in_one_group(
    store: SqliteStore, writes: list[Callable[[], Any]], hold: Callable[[], Callable[[], None]]
) -> list[Any]:
    """Run a first write, blocked by ``hold``'s lock, then ``writes`` on threads of
    their own while it waits; return each write's result or exception once all are
    done. The writes queue behind the first and commit in one group."""
    groups = store._source._groups._groups  # type: ignore[attr-defined]
    blocker = store.claim(request("other", "blocker")).lease
    unlock = hold()

    def outcome(write: Callable[[], Any]) -> Any:
        try:
            return write()
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(writes) + 1) as pool:
        first = pool.submit(store.heartbeat, blocker)
        # The first write is in flight (waiting for the lock): it took its group.
        until(lambda: committing(groups), "the first write never went out")
        results = [pool.submit(outcome, write) for write in writes]
        until(lambda: len(groups) == len(writes), "the writes never queued")
        unlock()
        first.result(timeout=30)
        return [result.result(timeout=30) for result in results]


def test_f1_a_zombies_finish_is_refused_inside_a_group_and_the_others_commit(
    sqlite_path: str, scope: str, commits: Commits, write_lock: Callable[[], Callable[[], None]]
) -> None:
    with SqliteStore(sqlite_path) as store:
        zombie = store.claim(request(scope, "taken", lock_timeout=SHORT)).lease
        time.sleep(SHORT.total_seconds() + 0.1)
        taker = store.claim(request(scope, "taken")).lease
        leases = [store.claim(request(scope, f"k{n}")).lease for n in range(6)]
        writes: list[Callable[[], Any]] = [
            lambda lease=lease: store.finish(lease, response(lease.key)) for lease in leases[:3]
        ]
        writes.append(lambda: store.finish(zombie, response("zombie")))
        writes += [
            lambda lease=lease: store.finish(lease, response(lease.key)) for lease in leases[3:]
        ]
        before = commits.grouped
        results = _in_one_group(store, writes, write_lock)

        assert isinstance(results[3], LockLost)
        assert [r for i, r in enumerate(results) if i != 3] == [None] * 6
        assert commits.grouped - before == len(writes)  # all seven in one group
        for lease in leases:
            record = store.get(scope, lease.key)
            assert record is not None and record.response is not None
            assert record.response.body == f"done {lease.key}".encode()
        taken = store.get(scope, "taken")
        assert taken is not None and taken.response is None
        assert taken.lock_token == taker.token


def test_an_operation_that_fails_inside_a_group_fails_alone(
    sqlite_path: str, scope: str, commits: Commits, write_lock: Callable[[], Callable[[], None]]
) -> None:
    """A claim that breaks the schema's key-length constraint, one whose parameter
    cannot be bound, and an operation that writes then fails sit in a group with good
    claims: they fail, with nothing of theirs written, and the good claims commit."""
    with SqliteStore(sqlite_path) as store:
        writes: list[Callable[[], Any]] = [
            lambda: store.claim(request(scope, "good-1")),
            lambda: store.claim(request(scope, "x" * 300)),  # CHECK (length(key) <= 255)
            lambda: store.claim(request(scope, "good-2")),
            lambda: store.claim(request(scope, "bad-param", method=object())),  # type: ignore[arg-type]
            lambda: store.claim(request(scope, "good-3")),
            lambda: store._perform(_insert_then_fail(scope, "half-done")),
        ]
        before = commits.grouped
        results = _in_one_group(store, writes, write_lock)

        assert commits.grouped - before == len(writes)
        assert isinstance(results[1], StoreError) and "CHECK" in str(results[1])
        assert isinstance(results[3], StoreError)
        for n, index in ((1, 0), (2, 2), (3, 4)):
            assert results[index].outcome is Outcome.EXECUTE
            assert store.get(scope, f"good-{n}") is not None
        assert store.get(scope, "x" * 300) is None
        assert store.get(scope, "bad-param") is None
        # Its own first statement, which succeeded, is rolled back with it.
        assert isinstance(results[5], StoreError)
        assert store.get(scope, "half-done") is None


def _insert_then_fail(scope: str, key: str) -> Callable[[Dialect], Op[None]]:
    """An operation whose first statement writes a key and whose second fails."""

    def op(d: Dialect) -> Op[None]:
        yield d.query("claim_insert", **d.claim_params(request(scope, key)))
        yield d.query("claim_read", scope=scope, key=object())
        return None

    return op


def test_a_lone_write_commits_at_once_on_its_own(
    sqlite_path: str, scope: str, commits: Commits
) -> None:
    """Idle, each write is its own commit, with no savepoint and no wait: what it
    wrote is visible to another connection the moment the call returns."""
    other = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        with SqliteStore(sqlite_path) as store:
            for n in range(5):
                before = commits.commits
                started = time.monotonic()
                lease = store.claim(request(scope, f"k{n}")).lease
                store.finish(lease, response(f"k{n}"))
                assert time.monotonic() - started < 1.0
                assert commits.commits - before == 2
                (status,) = other.execute(
                    "SELECT response_status FROM idempotency_keys WHERE scope = ? AND key = ?",
                    (scope, f"k{n}"),
                ).fetchone()
                assert status == 201
        assert commits.grouped == 0
    finally:
        other.close()


def test_a_lone_async_write_commits_at_once_on_its_own(
    sqlite_path: str, scope: str, commits: Commits
) -> None:
    async def main() -> None:
        async with AsyncSqliteStore(sqlite_path) as store:
            for n in range(5):
                before = commits.commits
                lease = (await store.claim(request(scope, f"k{n}"))).lease
                await store.finish(lease, response(f"k{n}"))
                assert commits.commits - before == 2
                record = await store.get(scope, f"k{n}")
                assert record is not None and record.response is not None

    asyncio.run(main())
    assert commits.grouped == 0


def test_async_writes_queued_behind_a_commit_go_in_one_group(
    sqlite_path: str, scope: str, commits: Commits, write_lock: Callable[[], Callable[[], None]]
) -> None:
    """The async store's committer, like the threads': writes queued while a commit
    waits go in one group, a zombie's is refused there and the rest commit."""

    async def main() -> list[Any]:
        async with AsyncSqliteStore(sqlite_path) as store:
            zombie = (await store.claim(request(scope, "taken", lock_timeout=SHORT))).lease
            await asyncio.sleep(SHORT.total_seconds() + 0.1)
            await store.claim(request(scope, "taken"))
            leases = [(await store.claim(request(scope, f"k{n}"))).lease for n in range(4)]
            blocker = (await store.claim(request("other", "blocker"))).lease
            unlock = write_lock()
            before = commits.grouped
            queued = store._source._shared.groups._groups  # type: ignore[attr-defined]
            first = asyncio.create_task(store.heartbeat(blocker))
            # The first write is in flight (waiting for the lock): it took its group.
            await until_async(lambda: committing(queued), "the first write never went out")
            finishes = [store.finish(lease, response(lease.key)) for lease in leases]
            finishes.insert(2, store.finish(zombie, response("zombie")))
            tasks = [asyncio.create_task(f) for f in finishes]
            await until_async(  # every finish waits behind the blocked commit
                lambda: len(queued) == len(finishes), "the finishes never queued"
            )
            unlock()
            await first
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert commits.grouped - before == len(finishes)
            for lease in leases:
                record = await store.get(scope, lease.key)
                assert record is not None and record.response is not None
            return results

    results = asyncio.run(main())
    assert isinstance(results[2], LockLost)
    assert [r for i, r in enumerate(results) if i != 2] == [None] * 4


# -- the committer cancelled mid-group ------------------------------------------------------


@pytest.mark.parametrize("commit", ["commits", "fails"])
def test_a_committer_cancelled_while_its_thread_commits_tells_no_one_before_the_commit(
    sqlite_path: str, scope: str, monkeypatch: pytest.MonkeyPatch, commit: str
) -> None:
    """The async committer cancelled (the loop closing) while its thread runs a
    group: the thread runs on, and has the results of the group's first writes (each
    from its savepoint) before its COMMIT runs. No caller may hear "done" before that
    COMMIT returned: each hears its write's true outcome once the thread is done,
    committed or not."""
    reached, release = threading.Event(), threading.Event()
    in_savepoints: list[None] = []
    original = _sqlite_base.SqliteConnection._run_in_savepoint

    def held_before_the_commit(conn: Any, write: Any) -> bool:
        kept = original(conn, write)
        in_savepoints.append(None)
        if len(in_savepoints) == 2:  # two writes of the group have their results
            reached.set()
            release.wait(30)
            if commit == "fails":  # as an I/O error would: the group rolls back
                raise StoreUnavailable("disk I/O error")
        return kept

    monkeypatch.setattr(_sqlite_base.SqliteConnection, "_run_in_savepoint", held_before_the_commit)

    async def main() -> tuple[list[Any], list[Any], bool]:
        async with AsyncSqliteStore(sqlite_path) as store:
            leases = [(await store.claim(request(scope, f"k{n}"))).lease for n in range(4)]
            # Four idle connections: the four finishes reach the committer's queue at
            # once, before it takes its first group.
            async with contextlib.AsyncExitStack() as held:
                for _ in range(4):
                    await held.enter_async_context(store._source.connection())
            tasks = [
                asyncio.create_task(store.finish(lease, response(lease.key))) for lease in leases
            ]
            assert await asyncio.to_thread(reached.wait, 10)
            committer = store._source._shared.groups._committer  # type: ignore[attr-defined]
            committer.cancel()
            for _ in range(50):  # loop rounds: the cancellation and what it wakes run
                await asyncio.sleep(0)
            told_early = [task.result() for task in tasks if task.done() and not task.exception()]
            release.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert committer.cancelled()
            records = [await store.get(scope, lease.key) for lease in leases]
            # The store goes on: the next write starts a committer of its own.
            assert (await store.claim(request(scope, "after"))).outcome is Outcome.EXECUTE
            return told_early, results, [r.response is not None for r in records]

    told_early, results, finished = asyncio.run(main())
    assert told_early == []
    if commit == "commits":
        assert len(in_savepoints) == 4  # all four in the one group
        assert results == [None] * 4 and finished == [True] * 4
    else:  # all four in the one group, which failed at its second write
        assert [type(r) for r in results] == [StoreUnavailable] * 4
        assert finished == [False] * 4


WRITER: contextvars.ContextVar[str | None] = contextvars.ContextVar("test_writer", default=None)


def test_the_async_committer_carries_no_writers_context(
    sqlite_path: str, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committer task commits every writer's writes: it must not carry the
    context (a trace span, log fields) of the writer whose write started it. Each
    write itself still runs in its own writer's context (see _Write)."""
    seen_by_commits: list[str | None] = []
    original = _sqlite_base.SqliteConnection.commit_group

    def watched(conn: Any, group: Any) -> None:
        seen_by_commits.append(WRITER.get())
        original(conn, group)

    monkeypatch.setattr(_sqlite_base.SqliteConnection, "commit_group", watched)

    async def write(name: str, store: AsyncSqliteStore) -> None:
        WRITER.set(name)  # in this writer's task only
        await store.claim(request(scope, name))

    async def main() -> None:
        async with AsyncSqliteStore(sqlite_path) as store:
            for n in range(3):
                await asyncio.create_task(write(f"w{n}", store))

    asyncio.run(main())
    assert seen_by_commits == [None] * 3


# -- crash: no acknowledged write is lost ------------------------------------------------


def _write_until_killed(path: str, scope: str, acks: Any, threads: int) -> None:
    """In a child process: ``threads`` threads claim and finish keys of their own as
    fast as they can, and report each write on ``acks`` once the store returned it."""
    store = SqliteStore(path)

    def work(worker: int) -> None:
        for n in range(100_000):
            key = f"w{worker}-{n}"
            lease = store.claim(request(scope, key)).lease
            acks.put(("claimed", key))
            store.finish(lease, response(key))
            acks.put(("finished", key))

    for worker in range(threads):
        threading.Thread(target=work, args=(worker,), daemon=True).start()
    time.sleep(600)


@pytest.mark.slow
def test_a_crash_during_group_commits_loses_no_acknowledged_write(
    sqlite_path: str, scope: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    acks = ctx.SimpleQueue()
    child = ctx.Process(target=_write_until_killed, args=(sqlite_path, scope, acks, 16))
    child.start()
    try:
        seen: list[tuple[str, str]] = []
        deadline = time.monotonic() + 60
        while len(seen) < 1500 and time.monotonic() < deadline:
            seen.append(acks.get())
        assert len(seen) >= 1500, "the child wrote too little to crash it mid-group"
    finally:
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(timeout=30)
    assert child.exitcode == -signal.SIGKILL
    while not acks.empty():  # what the child acknowledged before it died
        seen.append(acks.get())

    claimed = {key for what, key in seen if what == "claimed"}
    finished = {key for what, key in seen if what == "finished"}
    with sqlite3.connect(sqlite_path) as db:
        rows = dict(
            db.execute(
                "SELECT key, response_status FROM idempotency_keys WHERE scope = ?", (scope,)
            ).fetchall()
        )
    assert claimed <= set(rows), f"acknowledged claims lost: {sorted(claimed - set(rows))[:5]}"
    lost = sorted(key for key in finished if rows.get(key) != 201)
    assert not lost, f"acknowledged finishes lost: {lost[:5]}"
    # The integrity of the file after the kill.
    with sqlite3.connect(sqlite_path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
