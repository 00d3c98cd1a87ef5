"""Keyed fingerprints for HTTP (``Idempotency(fingerprint_secret=...)``): the stored
fingerprint is an HMAC-SHA-256, not the plain SHA-256 a reader of the store could
recompute from a guessed body; while the secret rotates, a retry of a request stored
under the previous secret still replays; under another secret it is 422 (P2).

Through Flask's test client on a real SQLite store, for a plain handler endpoint and a
request-as-transaction one (F3: the rotation's second claim is another transaction).
Checked failing without the code: without the secret in the fingerprint the first test
fails (the plain SHA-256 is stored); without the engine's second claim (`rotated`) the
rotation test answers 422 for the retry, in both modes."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask

from idempotence import open_store
from idempotence.contrib.flask import install
from idempotence.errors import ConfigurationError
from idempotence.http import Endpoint, Idempotency, Policy, RequestInfo, header_scope
from idempotence.http import request_fingerprint as plain_fingerprint

TENANT = "acct_1"
_keys = itertools.count()

Post = Callable[..., Any]


@pytest.fixture(params=["handler", "transaction"])
def make_app(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Callable[..., Post]]:
    """Apps over one store, each with its own secrets: a deploy before and after a
    rotation. Each app's ``orders`` counts the handler's runs."""
    store = open_store(f"sqlite:///{tmp_path / 'keys.sqlite3'}")
    store.migrate()
    policy = Policy(transaction=request.param == "transaction")
    runs: list[int] = []

    def make(secret: str | None = None, previous: str | None = None) -> Post:
        app = Flask(__name__)
        install(
            app,
            Idempotency(
                store=store,
                scope=header_scope("x-account-id"),
                endpoints=[Endpoint("POST /orders", policy)],
                fingerprint_secret=secret,
                previous_fingerprint_secret=previous,
            ),
        )

        @app.post("/orders")
        def create_order() -> tuple[dict[str, Any], int]:
            runs.append(1)
            return {"order": len(runs)}, 201

        client = app.test_client()

        def post(key: str, body: dict[str, Any]) -> Any:
            headers = {"x-account-id": TENANT, "idempotency-key": key}
            return client.post("/orders", json=body, headers=headers)

        post.runs = runs  # type: ignore[attr-defined]
        post.store = store  # type: ignore[attr-defined]
        return post

    yield make
    store.close()


def _key() -> str:
    return f"secret-{next(_keys)}"


def _fingerprint(body: dict[str, Any], secret: bytes | None) -> str:
    info = RequestInfo("POST", "/orders", headers=(("content-type", "application/json"),))
    return plain_fingerprint(info, json.dumps(body).encode(), secret=secret)


def test_the_stored_fingerprint_is_an_hmac_not_the_plain_sha256(make_app) -> None:
    post, key, body = make_app(secret="s3cret"), _key(), {"item": "tea"}
    assert post(key, body).status_code == 201
    record = post.store.get(TENANT, key)
    assert record is not None
    assert record.fingerprint != _fingerprint(body, None)
    assert record.fingerprint == _fingerprint(body, b"s3cret")


def test_a_retry_across_a_rotation_replays_and_new_keys_use_the_new_secret(make_app) -> None:
    body, old_key = {"item": "tea"}, _key()
    before = make_app(secret="old")
    first = before(old_key, body)
    assert first.status_code == 201
    during = make_app(secret="new", previous="old")
    again = during(old_key, body)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json == first.json and len(before.runs) == 1
    # Another body under the old key is still another request (P2).
    assert during(old_key, {"item": "coffee"}).status_code == 422
    # A key made during the rotation is stored under the new secret.
    new_key = _key()
    assert during(new_key, body).status_code == 201
    assert during.store.get(TENANT, new_key).fingerprint == _fingerprint(body, b"new")
    assert during.store.get(TENANT, old_key).fingerprint == _fingerprint(body, b"old")


def test_under_a_wrong_secret_the_key_is_a_mismatch(make_app) -> None:
    body, key = {"item": "tea"}, _key()
    assert make_app(secret="old")(key, body).status_code == 201
    after = make_app(secret="new")  # the rotation is over, or the secret is wrong
    answer = after(key, body)
    assert answer.status_code == 422 and answer.json["code"] == "idempotency_key_reused"
    assert len(after.runs) == 1


def test_secrets_are_checked_when_configured(tmp_path: Any) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'keys.sqlite3'}")
    scope = header_scope("x-account-id")
    with pytest.raises(ConfigurationError, match="fingerprint_secret must be a non-empty"):
        Idempotency(store=store, scope=scope, fingerprint_secret="")
    with pytest.raises(ConfigurationError, match="previous_fingerprint_secret needs"):
        Idempotency(store=store, scope=scope, previous_fingerprint_secret="old")
    config = Idempotency(store=store, scope=scope, fingerprint_secret="s3cret")
    assert "s3cret" not in repr(config)
    store.close()
