"""P6 under fire: concurrent duplicates of one key never both execute.

32 claims of one key start together, 200 times over, with threads, with asyncio
tasks, and (PostgreSQL) from 4 processes: every trial must yield exactly one EXECUTE
and 31 IN_PROGRESS. Zero duplicates allowed.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg_pool
import pytest

from idempotence import (
    AsyncSqliteStore,
    ClaimRequest,
    Outcome,
    SqliteStore,
    StoredResponse,
)
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from tests.support.claimers import claim_in_threads

CONCURRENCY = 32
TRIALS = 200
FP = "f" * 64


def claim(scope: str, key: str) -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint=FP)


def assert_exactly_one_execute(trials: dict[int, Counter[str]] | dict[int, dict[str, int]]) -> None:
    bad = {
        trial: dict(counts)
        for trial, counts in trials.items()
        if counts.get("execute", 0) != 1 or sum(counts.values()) != CONCURRENCY
    }
    assert not bad, f"trials without exactly one EXECUTE: {bad}"


def race_with_threads(store: Any, scope: str, trials: int, *, prepare: Any = None) -> None:
    barrier = threading.Barrier(CONCURRENCY)
    results: dict[int, Counter[str]] = {}
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        for trial in range(trials):
            key = f"trial-{trial}"
            if prepare is not None:
                prepare(key)

            def one(key: str = key) -> str:
                barrier.wait()
                return store.claim(claim(scope, key)).outcome.value

            results[trial] = Counter(pool.map(lambda _: one(), range(CONCURRENCY)))
    assert_exactly_one_execute(results)
    for counts in results.values():
        assert set(counts) <= {Outcome.EXECUTE.value, Outcome.IN_PROGRESS.value}


@pytest.fixture(params=["postgres", "sqlite"])
def sync_store(request: pytest.FixtureRequest) -> Any:
    if request.param == "postgres":
        store: Any = PostgresStore(request.getfixturevalue("pg_url"), max_size=CONCURRENCY)
    else:
        store = SqliteStore(request.getfixturevalue("sqlite_path"))
    yield store
    store.close()


@pytest.mark.slow
def test_p6_concurrent_first_claims_with_threads(sync_store: Any, scope: str) -> None:
    race_with_threads(sync_store, scope, TRIALS)


@pytest.mark.slow
def test_p6_p5_concurrent_takeovers_with_threads(sync_store: Any, scope: str) -> None:
    """32 retries of an abandoned key race to resume it: one takes it over."""

    def abandon(key: str) -> None:
        sync_store.release(sync_store.claim(claim(scope, key)).lease)

    race_with_threads(sync_store, scope, TRIALS // 4, prepare=abandon)


@pytest.mark.slow
def test_p6_concurrent_claims_in_serializable_transactions_are_retried(
    pg_url: str, scope: str
) -> None:
    """On a pool whose connections are not autocommit and run SERIALIZABLE, racing
    claims abort with serialization failures; the store retries them (bounded), and
    the race still has exactly one winner."""
    pool = psycopg_pool.ConnectionPool(
        pg_url,
        min_size=4,
        max_size=CONCURRENCY,
        kwargs={"options": "-c default_transaction_isolation=serializable"},
        open=True,
    )
    try:
        race_with_threads(PostgresStore(pool), scope, TRIALS // 4)
    finally:
        pool.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_p6_concurrent_first_claims_with_asyncio_tasks(
    backend: str, request: pytest.FixtureRequest, scope: str
) -> None:
    async def main() -> dict[int, Counter[str]]:
        if backend == "postgres":
            store: Any = AsyncPostgresStore(request.getfixturevalue("pg_url"), max_size=CONCURRENCY)
        else:
            store = AsyncSqliteStore(request.getfixturevalue("sqlite_path"))
        results: dict[int, Counter[str]] = {}
        try:
            for trial in range(TRIALS):
                start = asyncio.Event()

                async def one(key: str = f"trial-{trial}", start: Any = start) -> str:
                    await start.wait()
                    return (await store.claim(claim(scope, key))).outcome.value

                tasks = [asyncio.create_task(one()) for _ in range(CONCURRENCY)]
                await asyncio.sleep(0)
                start.set()
                results[trial] = Counter(await asyncio.gather(*tasks))
        finally:
            await store.close()
        return results

    assert_exactly_one_execute(asyncio.run(main()))


@pytest.mark.slow
def test_p6_concurrent_first_claims_across_four_processes(pg_url: str, scope: str) -> None:
    processes, per_process = 4, CONCURRENCY // 4
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(CONCURRENCY)
    results = ctx.Queue()
    workers = [
        ctx.Process(
            target=claim_in_threads,
            args=(pg_url, scope, TRIALS, per_process, barrier, results),
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    parts = [results.get(timeout=240) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    merged: dict[int, Counter[str]] = {t: Counter() for t in range(TRIALS)}
    for part in parts:
        for trial, counts in part.items():
            merged[trial].update(counts)
    assert_exactly_one_execute(merged)


def test_the_winner_finishes_and_every_loser_then_replays(sync_store: Any, scope: str) -> None:
    barrier = threading.Barrier(CONCURRENCY)

    def one(_: int) -> Any:
        barrier.wait()
        return sync_store.claim(claim(scope, "k"))

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        claims = list(pool.map(one, range(CONCURRENCY)))
    (winner,) = [c for c in claims if c.outcome is Outcome.EXECUTE]
    sync_store.finish(winner.lease, StoredResponse.of(201, body="won"))
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        replays = list(pool.map(lambda _: sync_store.claim(claim(scope, "k")), range(32)))
    assert {r.outcome for r in replays} == {Outcome.REPLAY}
    assert {r.response.body for r in replays} == {b"won"}
