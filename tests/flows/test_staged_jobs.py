"""R7: staged jobs commit with their phase, are taken once, and have deterministic keys.

The staged-jobs table is not split by scope, so on PostgreSQL each test gets a
database of its own (a SQLite database is a file of the test's own anyway).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from idempotence import SqliteStore
from idempotence.flows import Flow, PhaseContext, ResultKind
from idempotence.stores.postgres import PostgresStore
from tests.flows.support import finish, noting, request


@pytest.fixture
def jobs_store(backend: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    if backend == "postgres":
        store: Any = PostgresStore(request.getfixturevalue("fresh_pg_url"))
    else:
        store = SqliteStore(request.getfixturevalue("sqlite_flows_path"))
    yield store
    store.close()


def staging_flow(scope: str, failures: list[Exception], staged: list[list[str]]) -> Flow:
    """One phase that stages three jobs, then fails while ``failures`` lasts."""
    flow = Flow("r7")

    def stage(ctx: PhaseContext) -> Any:
        ctx.stage("send_receipt", {"n": 1})
        ctx.stage("send_receipt", {"n": 2})
        ctx.stage("notify", None, job_key=f"notify-{scope}")
        staged.append([job_key for job_key, _, _ in ctx.jobs])
        if failures:
            raise failures.pop()
        return finish()

    flow.phase("started")(noting("staged", stage))
    return flow


def peek(store: Any, backend: str, scope: str) -> list[tuple[str, str, Any]]:
    with store.transaction() as tx:
        rows = tx.execute(
            "SELECT job_key, name, args FROM idempotence_staged_jobs WHERE scope = :scope "
            "ORDER BY id",
            {"scope": scope},
        )
    # psycopg parses jsonb; SQLite hands back the JSON text.
    return [
        (r["job_key"], r["name"], json.loads(r["args"]) if backend == "sqlite" else r["args"])
        for r in rows
    ]


def test_r7_staged_jobs_commit_with_their_phase_or_not_at_all(
    jobs_store: Any, backend: str, scope: str
) -> None:
    flow = staging_flow(scope, [RuntimeError("after staging")], [])
    first = flow.run(jobs_store, request(flow, scope))
    assert first.kind is ResultKind.FAILED
    assert peek(jobs_store, backend, scope) == []  # rolled back with the phase

    second = flow.run(jobs_store, request(flow, scope))
    assert second.kind is ResultKind.EXECUTED
    jobs = peek(jobs_store, backend, scope)
    assert [(name, args) for _, name, args in jobs] == [
        ("send_receipt", {"n": 1}),
        ("send_receipt", {"n": 2}),
        ("notify", {}),
    ]


def test_r7_job_keys_are_deterministic(jobs_store: Any, scope: str) -> None:
    staged: list[list[str]] = []
    flow = staging_flow(scope, [RuntimeError("after staging")], staged)
    flow.run(jobs_store, request(flow, scope))
    flow.run(jobs_store, request(flow, scope))
    record = jobs_store.get(scope, "k")

    def keys(token: int) -> list[str]:
        return [
            f"r7-{record.id}-{token}-started-send_receipt-0",
            f"r7-{record.id}-{token}-started-send_receipt-1",
            f"notify-{scope}",
        ]

    # Each attempt derives its keys from the key row, its lease token and the job's
    # place in the phase: the rolled-back attempt's jobs never existed, and the
    # committed attempt's are the ones the runner deduplicates by.
    expected = keys(record.lock_token)
    assert staged == [keys(record.lock_token - 1), expected]
    with jobs_store.transaction() as tx:
        taken = jobs_store.take_staged_jobs(tx)
    assert [job.job_key for job in taken] == expected
    assert {job.key_id for job in taken} == {record.id}


def test_r7_take_staged_jobs_returns_each_job_once(jobs_store: Any, scope: str) -> None:
    flow = staging_flow(scope, [], [])
    assert flow.run(jobs_store, request(flow, scope)).kind is ResultKind.EXECUTED

    # A delivery that fails rolls its batch back: the jobs stay for the next enqueuer.
    with pytest.raises(ConnectionError), jobs_store.transaction() as tx:
        assert len(jobs_store.take_staged_jobs(tx)) == 3
        raise ConnectionError("the job queue is down")

    with jobs_store.transaction() as tx:
        first = jobs_store.take_staged_jobs(tx, limit=2)
    with jobs_store.transaction() as tx:
        rest = jobs_store.take_staged_jobs(tx)
    with jobs_store.transaction() as tx:
        none = jobs_store.take_staged_jobs(tx)
    assert [job.name for job in first] == ["send_receipt", "send_receipt"]
    assert [job.args for job in first] == [{"n": 1}, {"n": 2}]
    assert [job.name for job in rest] == ["notify"] and none == []
    assert len({job.job_key for job in first + rest}) == 3
