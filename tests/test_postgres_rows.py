"""The rows of the PostgreSQL store's own statements: dicts whose row maker is built
once per list of column names, with jsonb as text (parsed by the dialect); the application's
statements in the store's transactions keep psycopg's rows and types."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg

from idempotence import ClaimRequest, Outcome, StoredResponse
from idempotence.stores._sql.ops import Dialect
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from idempotence.stores.postgres._store_shared import Cursors


def _request(key: str, params: dict[str, object]) -> ClaimRequest:
    return ClaimRequest(
        scope="rows",
        key=key,
        fingerprint="f",
        params=params,
        lock_timeout=timedelta(seconds=30),
    )


def test_a_statement_text_whose_columns_change_is_read_again(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        cursors: Cursors[psycopg.Cursor[Any]] = Cursors(conn)
        cur = cursors.statements("the same text")
        assert cur.execute("SELECT 1 AS a").fetchall() == [{"a": 1}]
        # A migration that adds a column to the rows of a statement the cursor ran.
        assert cur.execute("SELECT 1 AS a, 2 AS b").fetchall() == [{"a": 1, "b": 2}]
        # One that drops a column and adds another: as many columns, other names.
        assert cur.execute("SELECT 2 AS b, 3 AS c").fetchall() == [{"b": 2, "c": 3}]
        cur.execute("SELECT 1 AS a WHERE false")
        assert cur.fetchall() == []
        cur = cursors.statements("jsonb")
        cur.execute("SELECT '{\"x\": [1]}'::jsonb AS j")
        assert cur.fetchall() == [{"j": '{"x": [1]}'}]
        # Closed (by the application, say): made again.
        cur.close()
        again = cursors.statements("SELECT 3 AS c")
        assert again is not cur and again.execute("SELECT 3 AS c").fetchall() == [{"c": 3}]
        app = cursors.application()
        assert app.execute("SELECT '[2]'::jsonb AS j").fetchall() == [{"j": [2]}]


def test_json_out_parses_text_and_bytes_and_passes_parsed_values() -> None:
    assert Dialect.json_out('{"x": 1}') == {"x": 1}
    assert Dialect.json_out(b'{"x": 1}') == {"x": 1}  # a SQL_ASCII database's text
    assert Dialect.json_out({"x": 1}) == {"x": 1}
    assert Dialect.json_out("{}") == {} and Dialect.json_out("[]") == []


def test_the_applications_jsonb_stays_parsed_in_the_stores_transactions(pg_url: str) -> None:
    select = "SELECT CAST(:j AS jsonb) AS j"
    with PostgresStore(pg_url, max_size=1) as store:
        with store.transaction(claim=_request("k1", {"p": [1, 2]})) as tx:
            assert tx.claim is not None and tx.claim.lease is not None
            assert tx.claim.record.params == {"p": [1, 2]}
            assert tx.execute(select, {"j": '{"a": 1}'}) == [{"j": {"a": 1}}]
            response = StoredResponse.of(201, headers=[("x-h", "v")], body="{}")
            store.finish(tx.claim.lease, response, tx=tx, at_commit=True)
        with store.transaction() as tx:
            assert tx.execute(select, {"j": "[1]"}) == [{"j": [1]}]
        replay = store.claim(_request("k1", {"p": [1, 2]}))
        assert replay.outcome is Outcome.REPLAY and replay.response == response
        assert replay.record.params == {"p": [1, 2]}


def test_the_applications_jsonb_stays_parsed_async(pg_url: str) -> None:
    async def main() -> None:
        async with AsyncPostgresStore(pg_url, max_size=1) as store:
            async with store.transaction(claim=_request("k2", {})) as tx:
                rows = await tx.execute("SELECT '{\"a\": 1}'::jsonb AS j")
                assert rows == [{"j": {"a": 1}}]
            claimed = await store.claim(_request("k3", {"q": "x"}))
            assert claimed.outcome is Outcome.EXECUTE and claimed.record.params == {"q": "x"}

    asyncio.run(main())
