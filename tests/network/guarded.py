"""A handler-mode request made by hand on a key store, for the failover trials: the
claim, the handler (a charge at a provider), the finish; a replay answers the stored
response. Split in two (`execute`, `settle`) so a trial can put a fault between the
handler and its finish.

The answer is what the HTTP middleware would send: the stored or fresh response, 409
for a key in progress, 503 when the store failed. A finish that fails is a 503 too
(the store did not confirm the answer), so a client never keeps an answer the store
may not have.

The :class:`Provider` charges once per derived key (R4: the key row's id and the
call's name), and answers a repeat with the first charge's id, as a real provider
does; it records each charge it makes in the history (an effect) and counts how many
times each key's handler ran.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

from idempotence.errors import StoreError
from idempotence.states import Claim, ClaimRequest, Outcome, StoredResponse
from idempotence.testing import History


class Provider:
    """One charge per derived key; the handler runs of each key, counted."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.runs: Counter[str] = Counter()
        self._charges: dict[str, str] = {}
        self._lock = threading.Lock()

    def charge(self, claim: Claim) -> bytes:
        """The handler of ``claim``'s key: charge under the key derived from its
        record's id; the charge's id, the handler's answer."""
        key = claim.record.key
        derived = f"{claim.record.scope}-{claim.record.id}-charge"
        with self._lock:
            self.runs[key] += 1
            charge = self._charges.get(derived)
            if charge is None:
                charge = self._charges[derived] = uuid.uuid4().hex
                self.history.effect(key, charge)
        return charge.encode()

    def rerun(self) -> int:
        """Keys whose handler ran more than once."""
        return sum(1 for n in self.runs.values() if n > 1)


def request(scope: str, key: str, lock: timedelta) -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint="f" * 64, lock_timeout=lock)


def execute(store: Any, provider: Provider, request: ClaimRequest) -> tuple[Claim | int, bytes]:
    """Claim; on EXECUTE run the handler. The claim, or the status a failed claim
    answers (503); and the body the handler answers."""
    try:
        claim: Claim = store.claim(request)
    except StoreError:
        return 503, b""
    if claim.outcome is not Outcome.EXECUTE:
        return claim, b""
    return claim, provider.charge(claim)


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


def run_key(store: Any, provider: Provider, request: ClaimRequest) -> tuple[int, bytes]:
    """The whole request: `execute`, then `settle`."""
    return settle(store, execute(store, provider, request))
