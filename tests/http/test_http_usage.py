"""The README's examples, as written there, and a store that is really unreachable."""

from __future__ import annotations

import warnings
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI
from flask import Flask, request
from pydantic import BaseModel

from idempotence import AsyncSqliteStore, SqliteStore
from idempotence.contrib.flask import install
from idempotence.http import (
    Endpoint,
    Idempotency,
    IdempotencyMiddleware,
    Policy,
    RequestInfo,
    current_async_transaction,
    current_transaction,
    header_scope,
)
from idempotence.stores import AsyncTransaction
from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from tests.http import apps
from tests.http.clients import open_harness

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TABLE = "CREATE TABLE IF NOT EXISTS transfers (account TEXT NOT NULL, amount INTEGER NOT NULL)"


class Transfer(BaseModel):
    amount: int


Transaction = Annotated[AsyncTransaction, Depends(current_async_transaction)]


def fastapi_example(store: AsyncSqliteStore) -> FastAPI:
    # -- README: FastAPI ------------------------------------------------------------------
    app = FastAPI()
    app.add_middleware(
        IdempotencyMiddleware,
        config=Idempotency(
            store=store,
            scope=header_scope("x-account-id"),  # set by the authenticating gateway
            endpoints=[Endpoint("POST /transfers", Policy(transaction=True))],
        ),
    )

    @app.post("/transfers", status_code=201)
    async def create_transfer(transfer: Transfer, tx: Transaction) -> dict[str, int]:
        await tx.execute(
            "INSERT INTO transfers (account, amount) VALUES (:account, :amount)",
            {"account": "acct_1", "amount": transfer.amount},
        )
        return {"amount": transfer.amount}

    @app.post("/charges", status_code=201)
    async def create_charge(transfer: Transfer) -> dict[str, int]:
        return {"charged": transfer.amount}  # guarded by the default policy

    return app


def flask_example(store: SqliteStore) -> Flask:
    # -- README: Flask ----------------------------------------------------------------------
    app = Flask(__name__)
    install(
        app,
        Idempotency(
            store=store,
            scope=header_scope("x-account-id"),
            endpoints=[Endpoint("POST /transfers", Policy(transaction=True))],
        ),
    )

    @app.post("/transfers")
    def create_transfer() -> Any:
        amount = request.get_json()["amount"]
        current_transaction().execute(
            "INSERT INTO transfers (account, amount) VALUES (:account, :amount)",
            {"account": "acct_1", "amount": amount},
        )
        return {"amount": amount}, 201

    return app


def count(path: str) -> int:
    with SqliteStore(path) as store, store.transaction() as tx:
        return int(tx.execute("SELECT count(*) AS n FROM transfers")[0]["n"])


@pytest.fixture
def db(sqlite_path: str) -> str:
    with SqliteStore(sqlite_path) as store, store.transaction() as tx:
        tx.execute(TABLE)
    return sqlite_path


HEADERS = {"x-account-id": "acct_1", "idempotency-key": "t-1"}


def test_fastapi_example(db):
    store = AsyncSqliteStore(db)
    with TestClient(fastapi_example(store)) as client:
        first = client.post("/transfers", json={"amount": 5}, headers=HEADERS)
        again = client.post("/transfers", json={"amount": 5}, headers=HEADERS)
        invalid = client.post(
            "/transfers", json={"amount": "x"}, headers={**HEADERS, "idempotency-key": "t-2"}
        )
        fixed = client.post(
            "/transfers", json={"amount": 6}, headers={**HEADERS, "idempotency-key": "t-2"}
        )
        charge = client.post(
            "/charges", json={"amount": 1}, headers={**HEADERS, "idempotency-key": "c"}
        )
        client.portal.call(store.close)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["idempotent-replayed"] == "true"
    assert invalid.status_code == 422  # FastAPI's validation error: nothing stored (R5)
    assert fixed.status_code == 201  # so the corrected request may reuse the key
    assert charge.status_code == 201
    assert count(db) == 2


def test_flask_example(db):
    with SqliteStore(db) as store:
        client = flask_example(store).test_client()
        first = client.post("/transfers", json={"amount": 5}, headers=HEADERS)
        again = client.post("/transfers", json={"amount": 5}, headers=HEADERS)
        other = client.post("/transfers", json={"amount": 7}, headers=HEADERS)
    assert (first.status_code, again.status_code, other.status_code) == (201, 201, 422)
    assert again.headers["idempotent-replayed"] == "true"
    assert count(db) == 1


def test_django_scope_callable_sees_the_http_request(sqlite_http_path, scope):
    from django.http import HttpRequest

    seen: list[Any] = []

    def tenant(info: RequestInfo) -> str | None:
        seen.append(info.raw)
        return info.raw.headers.get(apps.TENANT_HEADER)

    with open_harness("django", "sqlite", sqlite_http_path, scope, scope=tenant) as harness:
        assert harness.post(key="dj").status == 201
    assert isinstance(seen[0], HttpRequest)


# -- P11 with a store that is really unreachable ---------------------------------------------

DEAD_POSTGRES = "postgresql://postgres@127.0.0.1:1/none"


@pytest.mark.parametrize("framework", ["starlette", "flask"])
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_p11_unreachable_store_is_503_and_runs_nothing(framework, backend, tmp_path, scope):
    asgi = framework in apps.ASGI
    if backend == "postgres":
        kind: Any = AsyncPostgresStore if asgi else PostgresStore
        factory: Any = lambda: kind(DEAD_POSTGRES, connect_timeout=0.5)  # noqa: E731
    else:
        missing = str(tmp_path / "no" / "such" / "dir" / "keys.sqlite3")
        factory = lambda: (AsyncSqliteStore if asgi else SqliteStore)(missing)  # noqa: E731
    target = str(tmp_path / "inspect.sqlite3")
    SqliteStore(target).migrate()
    with open_harness(framework, "sqlite", target, scope, store_factory=factory) as harness:
        response = harness.post(key="down")
        assert response.status == 503
        assert response.json()["code"] == "idempotency_store_unavailable"
        assert int(response.header("retry-after")) >= 1
        assert harness.effects.total() == 0
