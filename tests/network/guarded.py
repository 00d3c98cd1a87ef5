"""A handler-mode request made by hand on a key store, for the failover trials: the
claim, the handler's effect (recorded in the history), the finish; a replay answers
the stored response. Split in two (`execute`, `settle`) so a trial can put a fault
between the handler and its finish.

The answer is what the HTTP middleware would send: the stored or fresh response, 409
for a key in progress, 503 when the store failed. A finish that fails is a 503 too
(the store did not confirm the answer), so a client never keeps an answer the store
may not have.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from idempotence.errors import StoreError
from idempotence.states import Claim, ClaimRequest, Outcome, StoredResponse
from idempotence.testing import History


def request(scope: str, key: str, lock: timedelta) -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint="f" * 64, lock_timeout=lock)


def execute(store: Any, history: History, request: ClaimRequest) -> tuple[Claim | int, bytes]:
    """Claim; on EXECUTE run the handler (one effect). The claim, or the status a
    failed claim answers (503); and the body the handler answers."""
    try:
        claim: Claim = store.claim(request)
    except StoreError:
        return 503, b""
    if claim.outcome is not Outcome.EXECUTE:
        return claim, b""
    return claim, history.effect(request.key, uuid.uuid4().hex).effect_id.encode()


def settle(store: Any, executed: tuple[Claim | int, bytes]) -> tuple[int, bytes]:
    """Finish an executed claim with the handler's body; the answer."""
    claim, body = executed
    if isinstance(claim, int):
        return claim, b""
    if claim.outcome is Outcome.REPLAY:
        assert claim.record.response is not None
        return claim.record.response.status, claim.record.response.body
    if claim.outcome is not Outcome.EXECUTE:
        return 409, b""
    assert claim.lease is not None
    try:
        store.finish(claim.lease, StoredResponse.of(201, body=body))
    except StoreError:
        return 503, b""
    return 201, body


def run_key(store: Any, history: History, request: ClaimRequest) -> tuple[int, bytes]:
    """The whole request: `execute`, then `settle`."""
    return settle(store, execute(store, history, request))
