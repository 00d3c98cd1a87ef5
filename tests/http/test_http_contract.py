"""DESIGN 4 and R5 over HTTP, on every framework and both stores.

Each test runs on Starlette, FastAPI, Litestar (ASGI, async store) and Flask, Django
(WSGI, sync store), on SQLite and PostgreSQL, through the framework's own test
client. Names carry the requirement they check (``test_p3_...``).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from idempotence import KeyState, key_state
from tests.http.apps import BIG, LEDGER_RETENTION, STREAM, STREAM_BIG

PROBLEM = "application/problem+json"


def assert_problem(response, status: int, code: str) -> dict:
    assert response.status == status, response.body
    assert response.header("content-type") == PROBLEM
    problem = response.json()
    assert problem["status"] == status
    assert problem["code"] == code
    assert problem["detail"]  # says what to fix
    return problem


# -- P1, P3: execute once, replay verbatim -------------------------------------------------


def test_p1_first_request_executes_and_stores_allowed_headers_only(harness):
    response = harness.post(key="p1")
    assert response.status == 201
    assert response.json()["n"] == 1
    assert response.header("idempotent-replayed") is None
    assert response.all("set-cookie")  # the original response is untouched
    record = harness.record("p1")
    assert record.finished and record.response.status == 201
    stored = dict(record.response.headers)
    assert set(stored) == {"content-type", "location", "x-trace"}  # never Set-Cookie
    assert record.response.body == response.body


def test_p3_replay_is_verbatim_and_marked(harness):
    first = harness.post(key="p3")
    again = harness.post(key="p3")
    assert again.status == 201
    assert again.body == first.body
    assert again.header("idempotent-replayed") == "true"
    assert again.header("location") == first.header("location")
    assert again.header("x-trace") == first.header("x-trace")  # configured replay header
    assert again.all("set-cookie") == []  # a session cookie is never replayed
    assert harness.effects.counts["/charges"] == 1


# -- P2: mismatch ----------------------------------------------------------------------------


def test_p2_other_body_is_a_mismatch(harness):
    harness.post(key="p2", body={"amount": 1})
    response = harness.post(key="p2", body={"amount": 2})
    problem = assert_problem(response, 422, "idempotency_key_reused")
    assert "POST /charges" in problem["detail"]
    assert harness.effects.counts["/charges"] == 1


def test_p2_key_reused_on_another_path_is_a_mismatch(harness):
    harness.post("/charges", key="p2-path")
    assert_problem(harness.post("/refunds", key="p2-path"), 422, "idempotency_key_reused")
    assert harness.effects.total() == 1


def test_p2_excluded_fields_and_key_order_do_not_matter(harness):
    first = harness.post(key="p2-ex", body={"amount": 7, "meta": {"sent_at": "a"}})
    again = harness.post(key="p2-ex", body={"meta": {"sent_at": "b"}, "amount": 7})
    assert again.status == 201
    assert again.header("idempotent-replayed") == "true"
    assert again.body == first.body


# -- P4, P5: a twin in progress, a crashed twin --------------------------------------------------


def test_p4_in_progress_is_409_with_retry_after(harness):
    harness.hold("p4")
    response = harness.post(key="p4")
    assert_problem(response, 409, "idempotency_key_in_use")
    assert response.header("retry-after") == "1"
    assert harness.effects.total() == 0


def test_p5_expired_lock_is_taken_over(harness):
    harness.hold("p5", lock_timeout=timedelta(milliseconds=1))
    time.sleep(0.02)
    response = harness.post(key="p5")
    assert response.status == 201
    record = harness.record("p5")
    assert record.finished and record.lock_token == 2


# -- P7, P8: the key and the body ------------------------------------------------------------------


def test_p7_missing_key_is_400_and_runs_nothing(harness):
    assert_problem(harness.post(), 400, "idempotency_key_missing")
    assert harness.effects.total() == 0


@pytest.mark.parametrize(
    "key",
    ["", "k" * 256, "tab\there", '"unterminated', '"bad" tail'],
    ids=["empty", "256", "control", "unterminated", "trailing"],
)
def test_p7_malformed_key_is_400(harness, key):
    assert_problem(harness.post(key=key), 400, "idempotency_key_invalid")
    assert harness.effects.total() == 0


def test_p7_body_over_the_limit_is_413_and_stores_nothing(harness):
    response = harness.post(key="p7-big", body={"pad": "x" * 4000})
    assert_problem(response, 413, "request_body_too_large")
    assert harness.record("p7-big") is None
    assert harness.effects.total() == 0


def test_p8_quoted_and_bare_forms_are_the_same_key(harness):
    first = harness.post(key='"p8-key"')
    again = harness.post(key="p8-key")
    assert again.header("idempotent-replayed") == "true"
    assert again.body == first.body
    assert harness.record("p8-key") is not None


def test_two_key_headers_are_400(harness):
    response = harness.post(headers=[("idempotency-key", "a"), ("idempotency-key", "b")])
    assert_problem(response, 400, "idempotency_key_repeated")
    assert harness.effects.total() == 0


def test_malformed_json_is_400_and_stores_nothing(harness):
    response = harness.post(key="bad-json", raw=b'{"amount": ')
    assert_problem(response, 400, "request_body_invalid")
    assert harness.record("bad-json") is None


# -- P9: other methods pass ----------------------------------------------------------------------


def test_p9_safe_and_unlisted_methods_pass_through(harness):
    assert harness.get("/charges").status == 201
    assert harness.post("/charges", method="PUT").status == 201  # not guarded by default
    assert_problem(harness.post("/charges", method="PATCH"), 400, "idempotency_key_missing")
    assert harness.post("/exempt").status == 201  # an endpoint configured unguarded


def test_p7_optional_key_guards_only_when_sent(harness):
    assert harness.post("/optional").status == 201
    first = harness.post("/optional", key="opt")
    assert harness.post("/optional", key="opt").body == first.body
    assert harness.effects.counts["/optional"] == 2


# -- P10: waiting for the twin -------------------------------------------------------------------


def test_p10_waits_for_the_twin_then_replays(harness):
    claim = harness.hold("p10", path="/waiting")
    finisher = threading.Timer(0.2, harness.finish_twin, (claim.lease,))
    finisher.start()
    try:
        response = harness.post("/waiting", key="p10")
    finally:
        finisher.join()
    assert response.status == 201
    assert response.body == b"from-twin"
    assert response.header("idempotent-replayed") == "true"
    assert harness.effects.total() == 0


def test_p10_wait_is_bounded(make_harness):
    with make_harness(default_wait=timedelta(milliseconds=150)) as harness:
        harness.hold("p10-bounded")
        started = time.monotonic()
        response = harness.post(key="p10-bounded")
        waited = time.monotonic() - started
    assert_problem(response, 409, "idempotency_key_in_use")
    assert 0.15 <= waited < 2


@pytest.mark.parametrize("backend", ["postgres"])
def test_p10_postgres_wakes_the_twin_by_notify_not_by_its_next_poll(make_harness, monkeypatch):
    """P10 on PostgreSQL: the waiting twin is woken by LISTEN/NOTIFY as soon as the first
    request finishes. Its polling pause is made as long as the whole wait, so polling
    alone would answer only after the 10 s."""
    from idempotence.flows import handler

    monkeypatch.setattr(handler, "FIRST_POLL", 60.0)
    monkeypatch.setattr(handler, "MAX_POLL", 60.0)
    with make_harness(default_wait=timedelta(seconds=10)) as harness:
        claim = harness.hold("p10-notify")
        finisher = threading.Timer(0.3, harness.finish_twin, (claim.lease,))
        started = time.monotonic()
        finisher.start()
        try:
            response = harness.post(key="p10-notify")
        finally:
            finisher.join()
        waited = time.monotonic() - started
    assert response.status == 201
    assert response.body == b"from-twin"
    assert response.header("idempotent-replayed") == "true"
    assert harness.effects.total() == 0
    assert 0.3 <= waited < 5


# -- P11: the store is down ----------------------------------------------------------------------


def test_p11_store_unavailable_is_503_and_runs_nothing(harness):
    harness.break_store()
    response = harness.post(key="p11")
    assert_problem(response, 503, "idempotency_store_unavailable")
    assert int(response.header("retry-after")) >= 1
    assert_problem(harness.post("/tx/p11", key="p11-tx"), 503, "idempotency_store_unavailable")
    assert harness.effects.total() == 0
    fail_open = harness.post("/open", key="p11-open")  # the explicit opt-in
    assert fail_open.status == 201
    assert harness.effects.counts["/open"] == 1


# -- B3: retention per endpoint -------------------------------------------------------------


def _retention(record) -> timedelta | None:
    assert record is not None and record.finished
    return None if record.expires_at is None else record.expires_at - record.finished_at


def test_b3_each_endpoint_keeps_its_keys_as_long_as_its_policy_says(harness):
    """The default policy keeps a finished key 24 hours; an endpoint's own retention
    (7 days) or None (forever, for ledgers) is what its keys get, not the default."""
    posts = {"b3-default": "/charges", "b3-ledger": "/ledger", "b3-ever": "/forever"}
    for key, path in posts.items():
        assert harness.post(path, key=key).status == 201
    assert _retention(harness.record("b3-default")) == timedelta(hours=24)
    assert _retention(harness.record("b3-ledger")) == LEDGER_RETENTION
    assert _retention(harness.record("b3-ever")) is None


# -- R5: what is stored ---------------------------------------------------------------------


def test_r5_rejected_request_stores_nothing_and_can_be_corrected(harness):
    assert harness.post("/reject", key="r5-422").status == 422
    assert harness.record("r5-422") is None
    assert harness.post("/reject", key="r5-422").status == 422
    assert harness.effects.counts["/reject"] == 2


def test_r5_terminal_4xx_is_stored(harness):
    first = harness.post("/declined", key="r5-402")
    again = harness.post("/declined", key="r5-402")
    assert (first.status, again.status) == (402, 402)
    assert again.header("idempotent-replayed") == "true"
    assert harness.effects.counts["/declined"] == 1
    assert (
        key_state(harness.record("r5-402"), harness.record("r5-402").created_at) is KeyState.FAILED
    )


@pytest.mark.parametrize("path", ["/unavailable", "/boom"])
def test_r5_server_errors_release_the_key_unstored(harness, path):
    assert harness.post(path, key="r5-5xx").status in (500, 503)
    record = harness.record("r5-5xx")
    assert record is not None and not record.finished and record.locked_at is None
    harness.post(path, key="r5-5xx")
    assert harness.effects.counts[path] == 2  # the retry ran it again


def test_r5_store_server_errors_opt_in(make_harness):
    with make_harness(default_store_server_errors=True) as harness:
        assert harness.post("/unavailable", key="r5-store").status == 503
        again = harness.post("/unavailable", key="r5-store")
        assert again.status == 503
        assert again.header("idempotent-replayed") == "true"
        assert harness.effects.counts["/unavailable"] == 1


# -- tenants -------------------------------------------------------------------------------


def test_same_key_in_two_tenants_runs_twice_and_never_crosses(harness):
    a = harness.post(key="shared", tenant=harness.tenant + "-a", body={"who": "a"})
    b = harness.post(key="shared", tenant=harness.tenant + "-b", body={"who": "b"})
    assert (a.status, b.status) == (201, 201)
    assert b.header("idempotent-replayed") is None
    assert a.json()["body"] != b.json()["body"]
    assert harness.effects.counts["/charges"] == 2
    again_b = harness.post(key="shared", tenant=harness.tenant + "-b", body={"who": "b"})
    assert again_b.body == b.body


def test_request_without_a_tenant_is_401(harness):
    assert_problem(harness.post(key="t", tenant=""), 401, "idempotency_tenant_unknown")
    assert harness.effects.total() == 0


# -- F3: request-as-transaction ------------------------------------------------------------------


def test_f3_writes_commit_with_the_response(harness):
    first = harness.post("/tx/a", key="f3")
    again = harness.post("/tx/a", key="f3")
    assert first.status == 201
    assert again.body == first.body and again.header("idempotent-replayed") == "true"
    assert harness.transfers() == 1
    assert harness.record("f3").finished


@pytest.mark.parametrize("path", ["/tx/reject", "/tx/boom"])
def test_f3_rejection_or_exception_rolls_back_everything(harness, path):
    assert harness.post(path, key="f3-no").status in (422, 500)
    assert harness.transfers() == 0
    assert harness.record("f3-no") is None  # the claim rolled back too


def test_f3_in_progress_is_409(harness):
    harness.hold("f3-busy", path="/tx/a")
    assert_problem(harness.post("/tx/a", key="f3-busy"), 409, "idempotency_key_in_use")
    assert harness.transfers() == 0


# -- large and streamed responses ----------------------------------------------------------------


def test_streamed_response_is_buffered_and_replayed(harness):
    first = harness.post("/stream", key="stream")
    again = harness.post("/stream", key="stream")
    assert first.body == again.body == b"".join(STREAM)
    assert again.header("idempotent-replayed") == "true"


@pytest.mark.parametrize(
    ("path", "expected"), [("/big/a", BIG), ("/stream-big", b"".join(STREAM_BIG))]
)
def test_too_large_response_is_sent_once_never_stored_truncated(harness, path, expected):
    first = harness.post(path, key="large")
    assert first.status == 201
    assert first.body == expected  # the original, whole
    record = harness.record("large")
    assert record.finished and record.error is not None  # errored: for an operator
    assert record.response.status == 500
    again = harness.post(path, key="large")
    problem = assert_problem(again, 500, "response_not_replayable")
    assert "will not be processed again" in problem["detail"]
    assert harness.effects.counts[path] == 1


def test_f3_too_large_response_is_refused_and_rolled_back(harness):
    response = harness.post("/bigtx/a", key="large-tx")
    assert_problem(response, 500, "response_too_large")
    assert harness.transfers() == 0
    assert harness.record("large-tx") is None


# -- a flow as the handler -----------------------------------------------------------------------


def test_flow_endpoint_runs_its_phases_once(harness):
    first = harness.post("/rides", key="ride", body={"amount": 5})
    again = harness.post("/rides", key="ride", body={"amount": 5})
    assert first.status == 201 and first.json()["amount"] == 5
    assert again.body == first.body and again.header("idempotent-replayed") == "true"
    assert harness.effects.counts["/rides:created"] == 1
    assert harness.record("ride").flow == "http-test-rides"


def test_flow_rejection_stores_nothing(harness):
    assert harness.post("/rides", key="ride-bad", body={"amount": -1}).status == 422
    assert harness.record("ride-bad") is None
    assert harness.post("/rides", key="ride-bad", body={"amount": 3}).status == 201


# -- the Stripe wire profile ---------------------------------------------------------------------


def test_stripe_profile(make_harness):
    with make_harness(profile="stripe") as harness:
        harness.post(key="s", body={"amount": 1})
        mismatch = harness.post(key="s", body={"amount": 2})
        assert mismatch.status == 400
        assert mismatch.header("content-type") == "application/json"
        assert mismatch.json()["error"]["type"] == "idempotency_error"
        assert mismatch.json()["error"]["message"]
        harness.hold("busy")
        busy = harness.post(key="busy")
        assert busy.status == 409
        assert busy.json()["error"]["code"] == "idempotency_key_in_use"
        assert busy.header("retry-after") == "1"


# -- P6: racing duplicates, through each test client -------------------------------------------


def test_p6_racing_duplicates_execute_once(harness):
    # The framework's test client from 16 threads at once (the real-server suite races
    # 32 over TCP); whatever the interleaving, one execution per key.
    for trial in range(3):
        barrier = threading.Barrier(16)

        def one(key: str = f"p6-{trial}", barrier: threading.Barrier = barrier):
            barrier.wait()
            return harness.post("/slow", key=key)

        with ThreadPoolExecutor(16) as pool:
            responses = [f.result() for f in [pool.submit(one) for _ in range(16)]]
        assert {r.status for r in responses} <= {201, 409}
        assert len({r.body for r in responses if r.status == 201}) == 1
        assert harness.effects.counts["/slow"] == trial + 1
