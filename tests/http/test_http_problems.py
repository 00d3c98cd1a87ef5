"""F6 over HTTP: the library's problems are stored profile-neutral and rendered by the
endpoint's wire profile, fresh and replayed, on every framework and both stores."""

from __future__ import annotations

from typing import Any

import pytest

from idempotence import StoredResponse
from tests.http.clients import Resp

#: Frameworks whose app lets an exception reach the middleware (R5: the library then
#: stores its own 500); the others turn it into their own 500 response first.
RAISE_THROUGH = frozenset({"starlette", "fastapi"})
WIRE = {"ietf": "application/problem+json", "stripe": "application/json"}


def assert_rendered(response: Resp, profile: str, status: int, code: str) -> None:
    """``response`` is the problem ``code`` in ``profile``'s wire form."""
    assert response.status == status, response.body
    assert response.header("content-type") == WIRE[profile]
    if profile == "stripe":
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("api_error", code)
        assert error["message"]
    else:
        problem = response.json()
        assert (problem["status"], problem["code"]) == (status, code)
        assert problem["detail"]


@pytest.mark.parametrize("profile", ["ietf", "stripe"])
def test_f6_r5_a_failed_flow_answers_in_the_endpoint_profile(make_harness, profile):
    # The drift this fixes: a flow's 500 was problem+json without a code, in any profile.
    with make_harness(profile=profile) as harness:
        response = harness.post("/failing", key="f6-fail", body={"outcome": "raise"})
        assert_rendered(response, profile, 500, "internal_error")


STORED = {
    "flow-500": ("/failing", {"outcome": "raise"}, {}, 500, "internal_error"),
    "flow-502": ("/failing", {"outcome": "indeterminate"}, {}, 502, "outcome_unknown"),
    "handler-500": ("/boom", {}, {"default_store_server_errors": True}, 500, "internal_error"),
}


@pytest.mark.parametrize("case", list(STORED))
def test_f6_p3_a_stored_problem_replays_in_the_replaying_endpoint_profile(
    make_harness, framework, case
):
    """R5's stored 500 and R6's 502, stored by an IETF endpoint, replay as Stripe
    errors from a Stripe endpoint on the same keys, and as problem details again."""
    path, body, settings, status, code = STORED[case]
    key = f"f6-{case}"
    if case == "handler-500" and framework not in RAISE_THROUGH:
        # The framework answers the exception inside the app: that 500 is the app's own
        # response, stored and replayed verbatim in every profile, never re-rendered.
        with make_harness(profile="ietf", **settings) as harness:
            first = harness.post(path, key=key, body=body)
            assert first.status == 500 and harness.record(key).finished
        for profile in ("stripe", "ietf"):
            with make_harness(profile=profile, **settings) as harness:
                again = harness.post(path, key=key, body=body)
                assert again.header("idempotent-replayed") == "true"
                assert (again.status, again.body) == (500, first.body)
                assert harness.effects.total() == 0
        return
    with make_harness(profile="ietf", **settings) as harness:
        assert harness.post(path, key=key, body=body).status == status
        assert harness.record(key).finished
    for profile in ("stripe", "ietf"):
        with make_harness(profile=profile, **settings) as harness:
            again = harness.post(path, key=key, body=body)
            assert again.header("idempotent-replayed") == "true"
            assert_rendered(again, profile, status, code)
            assert harness.effects.total() == 0


def test_f6_p3_an_application_problem_stored_rendered_replays_verbatim(make_harness):
    """Rows of earlier releases (and an application's own problem+json) are the stored
    response: a Stripe endpoint never rewrites them."""
    old: Any = StoredResponse.of(
        500, {"content-type": "application/problem+json"}, b'{"status": 500, "title": "x"}'
    )
    with make_harness(profile="stripe") as harness:
        harness.inspect.finish(harness.hold("f6-old").lease, old)
        again = harness.post(key="f6-old")
        assert (again.status, again.body) == (500, old.body)
        assert again.header("content-type") == "application/problem+json"
