"""``@idempotent(fingerprint_secret=...)``: the stored fingerprint of a call's arguments
is an HMAC-SHA-256, not the plain SHA-256; a call stored under the previous secret
still replays during a rotation; under another secret it is a mismatch (P2). On a real
SQLite store, plain and ``transactional=True`` (the rotation's second claim is another
transaction). Checked failing without the secret passed to the fingerprint (the first
test stores the plain digest) and without the engine's second claim (the rotation
raises ArgumentsMismatch)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from idempotence import ArgumentsMismatch, ConfigurationError, SqliteStore, idempotent
from idempotence.fingerprint import digest

_keys = itertools.count()


@pytest.fixture
def store(sqlite_path: str) -> Iterator[SqliteStore]:
    with SqliteStore(sqlite_path) as opened:
        opened.migrate()
        yield opened


@pytest.fixture(params=[False, True], ids=["plain", "transactional"])
def charge_with(
    request: pytest.FixtureRequest, store: SqliteStore
) -> Callable[..., Callable[[str, int], int]]:
    """``charge`` as deployed with the given secrets: one function name, one store."""
    runs: list[int] = []

    def make(**secrets: Any) -> Callable[[str, int], int]:
        @idempotent(store, key="order_id", name="charge", transactional=request.param, **secrets)
        def charge(order_id: str, amount: int) -> int:
            runs.append(amount)
            return len(runs)

        charge.runs = runs  # type: ignore[attr-defined]
        return charge

    return make


def _key() -> str:
    return f"call-{next(_keys)}"


def _stored(store: SqliteStore, key: str) -> str:
    record = store.get("charge", key)
    assert record is not None
    return record.fingerprint


def test_the_stored_fingerprint_is_keyed(charge_with: Any, store: SqliteStore) -> None:
    key = _key()
    charge_with(fingerprint_secret="s3cret")(key, 5)
    canonical = f'{{"amount":5,"order_id":"{key}"}}'.encode()
    plain = digest("CALL", "charge", "application/json", canonical)
    keyed = digest("CALL", "charge", "application/json", canonical, secret=b"s3cret")
    assert plain != keyed and _stored(store, key) == keyed


def test_a_call_across_a_rotation_replays(charge_with: Any, store: SqliteStore) -> None:
    key = _key()
    before = charge_with(fingerprint_secret="old")
    assert before(key, 5) == 1
    during = charge_with(fingerprint_secret="new", previous_fingerprint_secret="old")
    assert during(key, 5) == 1 and before.runs == [5]  # replayed, not run
    with pytest.raises(ArgumentsMismatch):
        during(key, 6)
    new_key = _key()
    during(new_key, 5)
    after = charge_with(fingerprint_secret="new")
    assert after(new_key, 5) == 2 and before.runs == [5, 5]  # stored under "new"
    assert _stored(store, new_key) != _stored(store, key)


def test_under_a_wrong_secret_the_call_is_a_mismatch(charge_with: Any) -> None:
    key = _key()
    charge_with(fingerprint_secret="old")(key, 5)
    with pytest.raises(ArgumentsMismatch):
        charge_with(fingerprint_secret="new")(key, 5)


def test_secrets_are_checked_at_decoration(store: SqliteStore) -> None:
    with pytest.raises(ConfigurationError, match="fingerprint_secret must be a non-empty"):
        idempotent(store, key="k", fingerprint_secret=b"")(lambda k: k)
    with pytest.raises(ConfigurationError, match="previous_fingerprint_secret needs"):
        idempotent(store, key="k", previous_fingerprint_secret="old")(lambda k: k)
