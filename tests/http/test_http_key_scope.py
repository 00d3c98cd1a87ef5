"""Key scoping per endpoint (``Policy(key_scope=KeyScope.ENDPOINT)``), on every framework
(ASGI and WSGI) and both stores: the same key on two endpoints gives two independent
results, where the default answers 422 (P2)."""

from __future__ import annotations

import pytest

from idempotence.errors import ConfigurationError
from idempotence.http import Endpoint, KeyScope, Policy

PROBLEM = "application/problem+json"


def test_p2_by_default_the_same_key_on_another_endpoint_is_422(harness):
    first = harness.post("/charges", key="shared")
    other = harness.post("/refunds", key="shared")
    assert first.status == 201
    assert other.status == 422 and other.json()["code"] == "idempotency_key_reused"
    assert harness.effects.counts["/refunds"] == 0


def test_per_endpoint_scope_gives_each_endpoint_its_own_result(make_harness):
    with make_harness(default_key_scope=KeyScope.ENDPOINT) as harness:
        charge = harness.post("/charges", key="shared")
        refund = harness.post("/refunds", key="shared")
        assert (charge.status, refund.status) == (201, 201)
        assert charge.json()["path"] == "/charges" and refund.json()["path"] == "/refunds"
        assert refund.header("idempotent-replayed") is None
        # Each replays its own answer, and ran once.
        again = [harness.post(path, key="shared") for path in ("/charges", "/refunds")]
        assert [a.body for a in again] == [charge.body, refund.body]
        assert [a.header("idempotent-replayed") for a in again] == ["true", "true"]
        assert harness.effects.counts["/charges"] == harness.effects.counts["/refunds"] == 1
        # Another method on the same path is another endpoint.
        patched = harness.post("/charges", key="shared", method="PATCH")
        assert patched.status == 201 and patched.header("idempotent-replayed") is None
        # Within one endpoint the key still names one request (P2).
        changed = harness.post("/charges", {"amount": 999}, key="shared")
        assert changed.status == 422 and changed.json()["code"] == "idempotency_key_reused"
        # And tenants stay apart.
        elsewhere = harness.post("/charges", key="shared", tenant=harness.tenant + "-2")
        assert elsewhere.status == 201 and elsewhere.header("idempotent-replayed") is None
        # The rows: one per endpoint, none under the bare tenant.
        tenant = harness.tenant
        assert harness.record("shared") is None
        for path in ("/charges", "/refunds"):
            record = harness.record("shared", tenant=f"{tenant} POST {path}")
            assert record is not None and record.finished and record.path == path


def test_per_endpoint_scope_in_request_as_transaction_mode(make_harness):
    endpoints = [Endpoint("POST /tx/{name}", Policy(transaction=True, key_scope=KeyScope.ENDPOINT))]
    with make_harness(endpoints=endpoints) as harness:
        first = harness.post("/tx/a", key="tx-shared")
        second = harness.post("/tx/b", key="tx-shared")
        assert (first.status, second.status) == (201, 201)
        replay = harness.post("/tx/b", key="tx-shared")
        assert replay.body == second.body and replay.header("idempotent-replayed") == "true"
        assert harness.effects.counts["/tx/a"] == harness.effects.counts["/tx/b"] == 1


def test_key_scope_is_checked_when_built():
    assert Policy(key_scope="endpoint").key_scope is KeyScope.ENDPOINT  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"key_scope='path'.*'tenant' or 'endpoint'"):
        Policy(key_scope="path")  # type: ignore[arg-type]
