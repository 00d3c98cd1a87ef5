"""Natural batching on PostgreSQL (DESIGN 11): claims and finishes that arrive while
one of their scope is out go out together as one statement, and each caller still
gets its own outcome (P1-P5), its own fence (F1) and its own error, while a lone
claim goes out at once, alone.

Batches are seen as round trips, counted by a proxy in front of the server
(tests/support/roundtrips.py). To hold a batch in flight, another transaction holds
the row of a key the batch takes over: its INSERT ... ON CONFLICT waits for the lock
(for as long as the test needs, its bound on lock waits raised: ``patient``).
The decisions alone (what goes in a batch) are tests/unit/test_batch.py.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from idempotence import ClaimRequest, LockLost, Outcome, StoredResponse
from idempotence.errors import StoreError, StoreInTransaction, StoreUnavailable
from idempotence.observability import NO_WATCH, Instrumentation, Watch
from idempotence.states import Claim
from idempotence.stores._sql import batch_plan as _batch
from idempotence.stores.postgres import AsyncPostgresStore
from tests.support.roundtrips import round_trips

FP = "f" * 64
#: Enough rounds for psycopg to have prepared every statement (after five runs), so
#: that no PREPARE lands in a counted round.
WARM_UP = 8
EXPIRE = (
    "UPDATE idempotency_keys SET locked_at = now() - interval '1 hour'"
    " WHERE scope = %s AND key = %s"
)


def request(scope: str, key: str, fingerprint: str = FP) -> ClaimRequest:
    return ClaimRequest(
        scope=scope, key=key, fingerprint=fingerprint, lock_timeout=timedelta(seconds=30)
    )


async def expire(url: str, scope: str, *keys: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for key in keys:
            await conn.execute(EXPIRE, (scope, key))


@asynccontextmanager
async def held_row(url: str, scope: str, key: str) -> AsyncIterator[None]:
    """Another transaction holds the row of ``key`` (claimed, its lock expired): a
    claim that takes it over waits until the block ends."""
    conn = await psycopg.AsyncConnection.connect(url)
    try:
        await conn.execute(
            "SELECT FROM idempotency_keys WHERE scope = %s AND key = %s FOR UPDATE", (scope, key)
        )
        yield
    finally:
        await conn.rollback()
        await conn.close()


async def lock_waiters(url: str, count: int = 1) -> list[int]:
    """The backends of the database waiting for a lock, once there are ``count``."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for _ in range(1000):
            cur = await conn.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            pids = [row[0] for row in await cur.fetchall()]
            if len(pids) >= count:
                return pids
            await asyncio.sleep(0.01)
    raise AssertionError("no statement came to wait for the held row")


async def blocked_key(store: AsyncPostgresStore, url: str, scope: str, key: str) -> None:
    """Make ``key`` one whose claim takes it over (claimed, lock expired)."""
    await store.claim(request(scope, key))
    await expire(url, scope, key)


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches wait for a held row as long as the test needs (not 50 ms)."""
    monkeypatch.setattr(_batch, "LOCK_WAIT", "60s")


def tasks(*coros: Awaitable[Any]) -> list[asyncio.Task[Any]]:
    # Started in order: the first is out (alone) before the next run and queue.
    return [asyncio.ensure_future(coro) for coro in coros]


async def settle(started: list[asyncio.Task[Any]]) -> list[Any]:
    return await asyncio.gather(*started, return_exceptions=True)


# -- outcomes ----------------------------------------------------------------------------


@pytest.mark.slow
def test_p1_to_p5_32_concurrent_claims_of_200_keys_each_get_their_own_outcome(
    pg_url: str, scope: str
) -> None:
    """Every key's 32 concurrent claims, batched: exactly one EXECUTE
    for a new key and for one whose lock expired (P1, P5, the takeover's token one
    higher), a replay of a finished key with its response (P3), a mismatch for another
    fingerprint (P2), IN_PROGRESS for a key held by a live lock (P4)."""
    groups = {
        "new": range(0, 60),
        "expired": range(60, 100),
        "finished": range(100, 140),
        "mismatch": range(140, 170),
        "held": range(170, 200),
    }
    group_of = {n: name for name, numbers in groups.items() for n in numbers}
    response = StoredResponse.of(201, body='{"ok":true}')

    async def main() -> tuple[dict[int, Counter[Outcome]], dict[int, int], list[int]]:
        async with AsyncPostgresStore(pg_url, max_size=8) as store:
            for n in range(60, 200):
                other = "0" * 64 if group_of[n] == "mismatch" else FP
                claim = await store.claim(request(scope, f"k{n}", other))
                assert claim.lease is not None
                if group_of[n] in {"finished", "mismatch"}:
                    await store.finish(claim.lease, response)
            await expire(pg_url, scope, *(f"k{n}" for n in groups["expired"]))
            sizes = sends(store)
            # In waves of 25 keys (800 claims at once: a burst of thousands on 8
            # connections meets the pool's own limits, batching or not), every
            # group in every wave.
            results = {}
            for wave in range(8):
                numbers = [n for n in range(200) if n % 8 == wave]
                claims = [store.claim(request(scope, f"k{n}")) for _ in range(32) for n in numbers]
                for index, claim in enumerate(await asyncio.gather(*claims)):
                    results.setdefault(numbers[index % len(numbers)], []).append(claim)
        outcomes: dict[int, Counter[Outcome]] = {n: Counter() for n in range(200)}
        tokens: dict[int, int] = {}
        for n, claims in results.items():
            for claim in claims:
                outcomes[n][claim.outcome] += 1
                if claim.outcome is Outcome.EXECUTE:
                    assert claim.lease is not None
                    tokens[n] = claim.lease.token
                if claim.outcome is Outcome.REPLAY:
                    assert claim.response == response
        return outcomes, tokens, sizes

    outcomes, tokens, sizes = asyncio.run(main())
    expected = {
        "new": Counter({Outcome.EXECUTE: 1, Outcome.IN_PROGRESS: 31}),
        "expired": Counter({Outcome.EXECUTE: 1, Outcome.IN_PROGRESS: 31}),
        "finished": Counter({Outcome.REPLAY: 32}),
        "mismatch": Counter({Outcome.MISMATCH: 32}),
        "held": Counter({Outcome.IN_PROGRESS: 32}),
    }
    wrong = {n: dict(got) for n, got in outcomes.items() if got != expected[group_of[n]]}
    assert wrong == {}
    assert {n: tokens[n] for n in groups["expired"]} == {n: 2 for n in groups["expired"]}
    assert {n: tokens[n] for n in groups["new"]} == {n: 1 for n in groups["new"]}
    # Batched: the claims that queued behind one went out together, up to one per
    # key of the wave (the other claims of a key in the queue went alone beside it).
    assert sizes and max(sizes) > 1 and max(sizes) <= 25, sizes


# -- batching happens, and not when idle ---------------------------------------------------


def test_d11_claims_that_arrive_while_one_is_out_go_out_as_one_statement(
    pg_url: str, scope: str
) -> None:
    async def main() -> list[dict[str, int]]:
        counts = []
        with round_trips(pg_url) as proxy:
            async with AsyncPostgresStore(proxy.url, max_size=1) as store:
                for round_ in range(WARM_UP + 1):
                    before = proxy.count
                    lone = await store.claim(request(scope, f"lone-{round_}"))
                    assert lone.outcome is Outcome.EXECUTE
                    after_lone = proxy.count
                    claims = await asyncio.gather(
                        *(store.claim(request(scope, f"r{round_}-{n}")) for n in range(32))
                    )
                    assert [c.outcome for c in claims] == [Outcome.EXECUTE] * 32
                    after_claims = proxy.count
                    leases = [c.lease for c in claims if c.lease is not None]
                    await asyncio.gather(
                        *(store.finish(lease, StoredResponse.of(200)) for lease in leases)
                    )
                    counts.append(
                        {
                            "lone claim": after_lone - before,
                            "32 claims": after_claims - after_lone,
                            "32 finishes": proxy.count - after_claims,
                        }
                    )
                replays = await asyncio.gather(
                    *(store.claim(request(scope, f"r0-{n}")) for n in range(32))
                )
                assert {c.outcome for c in replays} == {Outcome.REPLAY}
        return counts

    counts = asyncio.run(main())
    # The first of the 32 goes out at once, alone; the 31 that arrived meanwhile go
    # out together when it is back. A lone claim is one trip, sent at once.
    assert counts[-1] == {"lone claim": 1, "32 claims": 2, "32 finishes": 2}


def test_d11_a_lone_claim_does_not_wait_for_a_batch(pg_url: str, scope: str) -> None:
    """Idle, a claim goes out at once by itself: no task, no queue left behind, and a
    claim of another scope never waits behind a busy one."""

    async def main() -> None:
        async with AsyncPostgresStore(pg_url, max_size=2) as store:
            await blocked_key(store, pg_url, scope, "held")
            async with held_row(pg_url, scope, "held"):
                stuck = asyncio.ensure_future(store.claim(request(scope, "held")))
                await lock_waiters(pg_url)
                # The scope's lane is busy; another scope's claim goes out at once.
                other = await asyncio.wait_for(store.claim(request(scope + "-b", "k")), 5)
                assert other.outcome is Outcome.EXECUTE
            assert (await stuck).outcome is Outcome.EXECUTE
            lone = await asyncio.wait_for(store.claim(request(scope, "alone")), 5)
            assert lone.outcome is Outcome.EXECUTE
            batcher = store._batcher
            assert batcher is not None
            assert batcher._lanes == {} and batcher._tasks == set()

    asyncio.run(main())


# -- fencing, duplicates --------------------------------------------------------------------


def test_f1_a_zombies_finish_in_a_batch_is_refused_and_the_others_finish(
    pg_url: str, scope: str
) -> None:
    async def main() -> tuple[list[Any], int, list[Outcome]]:
        with round_trips(pg_url) as proxy:
            async with AsyncPostgresStore(proxy.url, max_size=1) as store:
                leases = []
                for n in range(10):
                    claim = await store.claim(request(scope, f"k{n}"))
                    assert claim.lease is not None
                    leases.append(claim.lease)
                zombie = leases[3]
                await expire(pg_url, scope, "k3")
                winner = await store.claim(request(scope, "k3"))
                assert winner.lease is not None and winner.lease.token == zombie.token + 1
                before = proxy.count
                results = await settle(
                    tasks(*(store.finish(lease, StoredResponse.of(201)) for lease in leases))
                )
                trips = proxy.count - before
                after = [(await store.claim(request(scope, f"k{n}"))).outcome for n in range(10)]
        return results, trips, after

    results, trips, after = asyncio.run(main())
    assert isinstance(results[3], LockLost) and results[3].token == 1
    assert [r for n, r in enumerate(results) if n != 3] == [None] * 9
    # The first finish alone, the nine others (the zombie's among them) as one, then
    # the zombie's alone: its statement, not the batch's, refuses it.
    assert trips <= 4, trips
    assert after[3] is Outcome.IN_PROGRESS  # the winner still holds k3
    assert [o for n, o in enumerate(after) if n != 3] == [Outcome.REPLAY] * 9


def sends(store: AsyncPostgresStore) -> list[int]:
    """The size of each statement the store's batcher sends from now on."""
    batcher = store._batcher
    assert batcher is not None
    sizes: list[int] = []
    send = batcher._send

    async def counted(queries: list[Any]) -> Any:
        sizes.append(len(queries))
        return await send(queries)

    batcher._send = counted
    return sizes


def test_p6_the_same_key_twice_in_one_queue_goes_out_once_in_the_batch_once_alone(
    pg_url: str, scope: str
) -> None:
    """Two claims of one key never share a statement (ON CONFLICT DO UPDATE cannot
    change a row twice): the second goes out alone beside the batch, and exactly one
    of the two takes the key (P6)."""

    async def main() -> tuple[list[list[Any]], list[int]]:
        rounds = []
        async with AsyncPostgresStore(pg_url, max_size=2) as store:
            sizes = sends(store)
            for round_ in range(10):
                key = f"dup-{round_}"
                rounds.append(
                    await settle(
                        tasks(
                            store.claim(request(scope, f"lead-{round_}")),
                            store.claim(request(scope, key)),
                            store.claim(request(scope, f"b-{round_}")),
                            store.claim(request(scope, key)),
                            store.claim(request(scope, f"c-{round_}")),
                        )
                    )
                )
        return rounds, sizes

    rounds, sizes = asyncio.run(main())
    for results in rounds:
        outcomes = [r.outcome for r in results]
        assert [outcomes[n] for n in (0, 2, 4)] == [Outcome.EXECUTE] * 3
        assert {outcomes[1], outcomes[3]} == {Outcome.EXECUTE, Outcome.IN_PROGRESS}
    # The lead alone; then the key, b and c as one batch each round (the key's second
    # claim alone, not through the batcher). A batch of four would have failed.
    assert sizes == [3] * 10


def test_p3_a_storm_of_retries_of_one_key_keeps_its_concurrency(pg_url: str, scope: str) -> None:
    """32 concurrent replays of one key cannot share a batch; they go out alone side
    by side, as without batching, not one batch after another."""

    async def main() -> tuple[list[int], int, int]:
        async with AsyncPostgresStore(pg_url, max_size=8) as store:
            claim = await store.claim(request(scope, "storm"))
            assert claim.lease is not None
            await store.finish(claim.lease, StoredResponse.of(200))
            sizes = sends(store)
            alone, peak = alones(store)
            replays = await asyncio.gather(
                *(store.claim(request(scope, "storm")) for _ in range(32))
            )
            assert {r.outcome for r in replays} == {Outcome.REPLAY}
            return sizes, len(alone), max(peak)

    sizes, alone, peak = asyncio.run(main())
    # Through the batcher: the first claim alone, the 31 others queued behind it. Of
    # those one batch of one (the first queued), and the 30 others alone, all of them
    # out at once (not one batch after another, nor one at a time).
    assert sizes == [1]
    assert alone == 1 + 30
    assert peak == 30


def alones(store: AsyncPostgresStore) -> tuple[list[None], list[int]]:
    """Every operation the store's batcher runs alone from now on (one entry each),
    and how many were running at each start."""
    batcher = store._batcher
    assert batcher is not None
    started: list[None] = []
    peak: list[int] = []
    running = 0
    run_alone = batcher._alone

    async def counted(make_op: Any) -> Any:
        nonlocal running
        started.append(None)
        running += 1
        peak.append(running)
        try:
            return await run_alone(make_op)
        finally:
            running -= 1

    batcher._alone = counted
    return started, peak


#: Which caller the code running now belongs to (a trace span's, a log context's stand-in).
CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("test_caller", default=None)


class Attributing(Instrumentation):
    """Notes, for each claim watched and each refused fenced write, whose context
    reported it."""

    def __init__(self) -> None:
        self.claims: list[tuple[str, str | None]] = []
        self.lost: list[tuple[int, str | None]] = []

    def claim(self, request: ClaimRequest) -> Watch[Claim]:
        self.claims.append((request.key, CALLER.get()))
        return NO_WATCH

    def lock_lost(self, operation: str, error: LockLost) -> None:
        self.lost.append((error.token, CALLER.get()))


async def as_caller(name: str, work: Awaitable[Any]) -> Any:
    CALLER.set(name)  # in this caller's task only
    return await work


def test_d11_a_batch_runs_in_no_callers_context_and_each_caller_reports_in_its_own(
    pg_url: str, scope: str
) -> None:
    """The task that sends a lane's batches serves every caller in them: it must not
    carry the context of the caller whose statement started it (its trace span, its
    log fields). Each caller's own instrumentation (its claim's watch, its refused
    finish, F1) still reports in that caller's context."""
    seen_by_batches: list[str | None] = []

    async def main() -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        hooks = Attributing()
        async with AsyncPostgresStore(pg_url, max_size=2, instrumentation=hooks) as store:
            batcher = store._batcher
            assert batcher is not None
            send = batcher._send

            async def watched(queries: list[Any]) -> Any:
                seen_by_batches.append(CALLER.get())
                return await send(queries)

            batcher._send = watched
            keys = [f"k{n}" for n in range(4)]
            claims = await settle(
                tasks(*(as_caller(key, store.claim(request(scope, key))) for key in keys))
            )
            zombie = claims[2].lease
            await expire(pg_url, scope, "k2")
            assert (await store.claim(request(scope, "k2"))).lease.token == zombie.token + 1
            finishes = await settle(
                tasks(
                    *(
                        as_caller(
                            claim.lease.key, store.finish(claim.lease, StoredResponse.of(201))
                        )
                        for claim in claims
                    )
                )
            )
            return hooks.claims, hooks.lost, claims, finishes

    claims, lost, outcomes, finishes = asyncio.run(main())
    assert [c.outcome for c in outcomes] == [Outcome.EXECUTE] * 4
    assert isinstance(finishes[2], LockLost)
    # Both the claims and the finishes went out in batches, none in a caller's context.
    assert len(seen_by_batches) == 2
    assert seen_by_batches == [None, None]
    # Each claim watched in its own caller's context (the takeover of k2: the test's).
    assert sorted(claims[:4]) == [(f"k{n}", f"k{n}") for n in range(4)]
    assert claims[4] == ("k2", None)
    assert lost == [(1, "k2")]


# -- errors and cancellation ---------------------------------------------------------------


def test_p11_the_server_killing_a_batchs_connection_reaches_every_caller_in_it(
    pg_url: str, scope: str, patient: None
) -> None:
    async def main() -> list[Any]:
        async with AsyncPostgresStore(pg_url, max_size=2) as store:
            await blocked_key(store, pg_url, scope, "held")
            async with held_row(pg_url, scope, "held"):
                started = tasks(
                    store.claim(request(scope, "lead")),
                    store.claim(request(scope, "held")),
                    store.claim(request(scope, "a")),
                    store.claim(request(scope, "b")),
                )
                (pid,) = await lock_waiters(pg_url)
                async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
                    await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                results = await settle(started)
            # The store goes on: the pool replaces the connection.
            again = await store.claim(request(scope, "after"))
            assert again.outcome is Outcome.EXECUTE
            return results

    results = asyncio.run(main())
    assert results[0].outcome is Outcome.EXECUTE  # alone, before the batch
    assert [type(r) for r in results[1:]] == [StoreUnavailable] * 3
    # Each caller its own exception (a raise adds to its traceback, a handler may
    # change it), the batch's one error the cause of each.
    assert len({id(r) for r in results[1:]}) == 3
    assert len({id(r.__cause__) for r in results[1:]}) == 1
    assert isinstance(results[1].__cause__, StoreUnavailable)
    assert str(results[1]) == str(results[1].__cause__)


def test_f1_a_finish_in_a_batch_whose_row_changed_after_its_snapshot_still_finishes(
    pg_url: str, scope: str, patient: None
) -> None:
    """finish_batch takes each row by the ctid of the version its snapshot saw. A
    duplicate that marks itself a waiter (P10) while the batch waits for the row's lock
    commits a newer version, which the batch then leaves unchanged: the holder's finish
    must still go through (sent again alone) and wake the waiter, never be refused."""

    async def main() -> tuple[list[Any], int, Outcome]:
        with round_trips(pg_url) as proxy:
            # One connection: a pool that may grow would open its second one (two
            # trips to set it up) whenever the machine lets it, inside the count.
            async with AsyncPostgresStore(proxy.url, max_size=1) as store:
                leases = []
                for key in ("lead", "marked", "other"):
                    claim = await store.claim(request(scope, key))
                    assert claim.lease is not None
                    leases.append(claim.lease)
                marker = await psycopg.AsyncConnection.connect(pg_url)
                try:
                    await marker.execute(
                        "UPDATE idempotency_keys SET waiters = true WHERE scope = %s AND key = %s",
                        (scope, "marked"),
                    )
                    before = proxy.count
                    started = tasks(
                        *(store.finish(lease, StoredResponse.of(201)) for lease in leases)
                    )
                    await lock_waiters(pg_url)
                    await marker.commit()
                finally:
                    await marker.close()
                results = await asyncio.wait_for(settle(started), 10)
                trips = proxy.count - before
                replay = await store.claim(request(scope, "marked"))
        return results, trips, replay.outcome

    results, trips, replay = asyncio.run(main())
    assert results == [None] * 3
    # The lead alone, the two others as one batch, the marked key's finish again alone:
    # the batch did finish the other key.
    assert trips == 3, trips
    assert replay is Outcome.REPLAY


def test_f8_a_key_held_by_an_open_transaction_does_not_hold_up_its_batch(
    pg_url: str, scope: str
) -> None:
    """A batch meeting a row that another transaction holds gives up its lock wait
    after a moment and goes again claim by claim: the others are answered while the
    row is still held, and only that key's claim waits, as it would have alone."""

    async def main() -> tuple[list[Any], Any]:
        async with AsyncPostgresStore(pg_url, max_size=3) as store:
            await blocked_key(store, pg_url, scope, "held")
            async with held_row(pg_url, scope, "held"):
                started = tasks(
                    store.claim(request(scope, "lead")),
                    store.claim(request(scope, "held")),
                    store.claim(request(scope, "a")),
                    store.claim(request(scope, "b")),
                )
                answered = await asyncio.wait_for(settle([started[0], *started[2:]]), 10)
                assert not started[1].done()
            return answered, await started[1]

    answered, held = asyncio.run(main())
    assert [r.outcome for r in answered] == [Outcome.EXECUTE] * 3
    assert held.outcome is Outcome.EXECUTE and held.lease.token == 2


def test_a_value_the_database_refuses_fails_only_its_own_caller(pg_url: str, scope: str) -> None:
    async def main() -> list[Any]:
        async with AsyncPostgresStore(pg_url, max_size=2) as store:
            results = await settle(
                tasks(
                    store.claim(request(scope, "lead")),
                    store.claim(request(scope, "a")),
                    store.claim(request(scope, "bad\x00key")),  # text cannot hold NUL
                    store.claim(request(scope, "b")),
                )
            )
            # Each claim of the batch was sent again alone: nothing went twice.
            assert (await store.claim(request(scope, "a"))).outcome is Outcome.IN_PROGRESS
            return results

    results = asyncio.run(main())
    assert isinstance(results[2], StoreError) and "NUL" in str(results[2])
    assert [r.outcome for n, r in enumerate(results) if n != 2] == [Outcome.EXECUTE] * 3


def test_a_cancelled_waiter_leaves_the_batch_and_the_others_go_on(pg_url: str, scope: str) -> None:
    async def main() -> tuple[list[Any], Any]:
        async with AsyncPostgresStore(pg_url, max_size=2) as store:
            await blocked_key(store, pg_url, scope, "held")
            async with held_row(pg_url, scope, "held"):
                started = tasks(
                    store.claim(request(scope, "held")),  # out alone, waiting for the row
                    store.claim(request(scope, "a")),
                    store.claim(request(scope, "gone")),
                    store.claim(request(scope, "b")),
                )
                await lock_waiters(pg_url)
                started[2].cancel()
                await asyncio.sleep(0)
            results = await settle(started)
            return results, await store.get(scope, "gone")

    results, gone = asyncio.run(main())
    assert isinstance(results[2], asyncio.CancelledError)
    assert [r.outcome for n, r in enumerate(results) if n != 2] == [Outcome.EXECUTE] * 3
    assert gone is None  # it never went out


def test_a_cancelled_caller_whose_batch_is_out_does_not_break_the_batch(
    pg_url: str, scope: str, patient: None
) -> None:
    async def main() -> list[Any]:
        async with AsyncPostgresStore(pg_url, max_size=2) as store:
            await blocked_key(store, pg_url, scope, "held")
            async with held_row(pg_url, scope, "held"):
                started = tasks(
                    store.claim(request(scope, "lead")),
                    store.claim(request(scope, "a")),
                    store.claim(request(scope, "held")),  # holds the batch up
                    store.claim(request(scope, "b")),
                )
                await lock_waiters(pg_url)
                started[1].cancel()
                await asyncio.sleep(0)
            return await settle(started)

    results = asyncio.run(main())
    assert isinstance(results[1], asyncio.CancelledError)
    assert [r.outcome for n, r in enumerate(results) if n != 1] == [Outcome.EXECUTE] * 3


def test_a_cancelled_lone_claim_hands_the_queue_on(pg_url: str, scope: str) -> None:
    """The claim out alone is cancelled while the next ones wait for it: they still
    go out (the lane is not left busy with nobody to send for it)."""

    async def main() -> list[Any]:
        async with AsyncPostgresStore(pg_url, max_size=2) as store:
            await blocked_key(store, pg_url, scope, "held")
            async with held_row(pg_url, scope, "held"):
                started = tasks(
                    store.claim(request(scope, "held")),
                    store.claim(request(scope, "a")),
                    store.claim(request(scope, "b")),
                )
                await lock_waiters(pg_url)
                started[0].cancel()
                results = await asyncio.wait_for(settle(started), 10)
            return results

    results = asyncio.run(main())
    assert isinstance(results[0], asyncio.CancelledError)
    assert [r.outcome for r in results[1:]] == [Outcome.EXECUTE] * 2


def test_a_claim_inside_the_stores_transaction_fails_at_once_with_a_busy_lane(
    pg_url: str, scope: str
) -> None:
    """The nesting rule holds for a claim that would queue for a batch: with a claim
    of the scope out (waiting for a held row), a claim without ``tx=`` made inside the
    store's own transaction raises StoreInTransaction at once instead of going out in
    the next batch on another connection (the queued path skipped the check)."""

    async def main() -> tuple[BaseException | None, Any]:
        async with AsyncPostgresStore(pg_url, max_size=4) as store:
            await blocked_key(store, pg_url, scope, "held")
            async with held_row(pg_url, scope, "held"):
                out = asyncio.ensure_future(store.claim(request(scope, "held")))
                await lock_waiters(pg_url)
                error = None
                async with store.transaction():
                    try:
                        await asyncio.wait_for(store.claim(request(scope, "inner")), 5)
                    except StoreInTransaction as exc:
                        error = exc
            await out
            return error, await store.get(scope, "inner")

    error, inner = asyncio.run(main())
    assert isinstance(error, StoreInTransaction)
    assert inner is None  # nothing went out for it
