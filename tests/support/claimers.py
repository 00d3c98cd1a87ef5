"""Claimers for the cross-process concurrency test (importable by spawned processes)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from idempotence import ClaimRequest
from idempotence.stores.postgres import PostgresStore


def claim_in_threads(
    url: str, scope: str, trials: int, threads: int, barrier: Any, results: Any
) -> None:
    """Run ``threads`` claimers; for each trial all of them claim key ``trial-N``.

    ``barrier`` is a multiprocessing.Barrier shared by every thread of every process,
    so all claims of a trial start together. Puts ``{trial: Counter(outcome)}``.
    """
    store = PostgresStore(url, max_size=threads)
    outcomes: dict[int, Counter[str]] = {t: Counter() for t in range(trials)}
    lock = threading.Lock()

    def work() -> None:
        for trial in range(trials):
            barrier.wait()
            claim = store.claim(
                ClaimRequest(scope=scope, key=f"trial-{trial}", fingerprint="f" * 64)
            )
            with lock:
                outcomes[trial][claim.outcome.value] += 1

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    store.close()
    results.put({trial: dict(counter) for trial, counter in outcomes.items()})
