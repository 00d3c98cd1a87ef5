"""``Consumer(fingerprint_secret=...)``: a message's body is fingerprinted with
HMAC-SHA-256, not the plain SHA-256; during a rotation a redelivery of a message
stored under the previous secret is a duplicate; under another secret the same id is a
mismatch, dead-lettered (P2, M1). On a real SQLite store, in handler and transactional
mode. Checked failing without the secret in the consumer's fingerprint (the stored
fingerprint is the plain digest) and without the engine's second claim (the redelivery
during the rotation is dead-lettered)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from idempotence import SqliteStore
from idempotence.consumers import Action, Consumer, Message, process
from idempotence.errors import ConfigurationError

_ids = itertools.count()
BODY = b'{"order": 7}'


@pytest.fixture(params=[False, True], ids=["handler", "transactional"])
def consumer_with(request: pytest.FixtureRequest) -> Callable[..., Consumer]:
    def make(**secrets: Any) -> Consumer:
        return Consumer(
            name="receipts", handler=lambda ctx: None, transactional=request.param, **secrets
        )

    return make


def _id() -> str:
    return f"message-{next(_ids)}"


def test_the_stored_fingerprint_is_keyed(consumer_with: Any, consumer_sqlite_path: str) -> None:
    message_id = _id()
    with SqliteStore(consumer_sqlite_path) as store:
        done = process(consumer_with(fingerprint_secret="s3cret"), store, Message(BODY, message_id))
        record = store.get("receipts", message_id)
    assert done.outcome == "processed" and record is not None
    assert record.fingerprint != hashlib.sha256(BODY).hexdigest()
    assert record.fingerprint == hmac.new(b"s3cret", BODY, hashlib.sha256).hexdigest()


def test_a_redelivery_across_a_rotation_is_a_duplicate(
    consumer_with: Any, consumer_sqlite_path: str
) -> None:
    message_id = _id()
    during = consumer_with(fingerprint_secret="new", previous_fingerprint_secret="old")
    with SqliteStore(consumer_sqlite_path) as store:
        process(consumer_with(fingerprint_secret="old"), store, Message(BODY, message_id))
        again = process(during, store, Message(BODY, message_id, redelivered=True))
        other = process(during, store, Message(b'{"order": 8}', message_id, redelivered=True))
    assert (again.action, again.outcome) == (Action.ACK, "duplicate")
    assert other.action is Action.DEAD_LETTER  # another body under the id (P2)


def test_under_a_wrong_secret_the_id_is_a_mismatch(
    consumer_with: Any, consumer_sqlite_path: str
) -> None:
    message_id = _id()
    with SqliteStore(consumer_sqlite_path) as store:
        process(consumer_with(fingerprint_secret="old"), store, Message(BODY, message_id))
        again = process(consumer_with(fingerprint_secret="new"), store, Message(BODY, message_id))
    assert again.action is Action.DEAD_LETTER


def test_secrets_are_checked_when_built() -> None:
    with pytest.raises(ConfigurationError, match="fingerprint_secret must be a non-empty"):
        Consumer(name="r", handler=print, fingerprint_secret="")
    with pytest.raises(ConfigurationError, match="previous_fingerprint_secret needs"):
        Consumer(name="r", handler=print, previous_fingerprint_secret="old")
