"""The Rocket Rides API through a real server, on SQLite and PostgreSQL: every answer
``POST /v1/rides`` can give, and what each leaves behind (DESIGN 4, 5)."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator

import httpx
import pytest

from rocket_rides.chaos import CRASH_HEADER, DELAY_HEADER
from rocket_rides.run import free_port, start_stack
from rocket_rides.stack import StackConfig
from tests.demo.conftest import LOCK_TIMEOUT, Service, assert_group_gone

#: The slow tier: the demo stack in processes of its own.
pytestmark = pytest.mark.slow

RIDE = {"origin_lat": 48.8809, "origin_lon": 2.3553, "target_lat": 48.7262, "target_lon": 2.3652}


def headers(key: str | None, user: str | None = "user-1", **extra: str) -> dict[str, str]:
    found = dict(extra)
    if user is not None:
        found["Authorization"] = f"Bearer {user}"
    if key is not None:
        found["Idempotency-Key"] = key
    return found


def post(api: httpx.Client, key: str | None, body: object = RIDE, **kw: str) -> httpx.Response:
    return api.post("/v1/rides", json=body, headers=headers(key, **kw))


def test_p1_a_ride_is_booked_and_charged_once(api: httpx.Client, service: Service, key: str):
    response = post(api, key)

    assert response.status_code == 201
    assert "idempotent-replayed" not in response.headers
    ride = response.json()
    assert ride["amount"] == 2000 and ride["currency"] == "usd" and ride["status"] == "charged"
    assert ride["origin_lat"] == RIDE["origin_lat"]
    [charge] = service.charges(key)
    assert (charge["id"], charge["status"]) == (ride["charge_id"], "succeeded")


def test_p3_a_retry_replays_the_stored_response(api: httpx.Client, service: Service, key: str):
    first = post(api, key)
    again = post(api, key)

    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert len(service.charges(key)) == 1


def test_r5_a_declined_card_is_a_stored_402(api: httpx.Client, service: Service, key: str):
    first = post(api, key, user="user-3-declined")
    again = post(api, key, user="user-3-declined")

    assert first.status_code == 402
    assert first.headers["content-type"] == "application/problem+json"
    problem = first.json()
    assert problem["code"] == "card_declined"
    assert (again.status_code, again.content) == (402, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    [charge] = service.charges(key)
    assert (charge["id"], charge["status"]) == (problem["charge_id"], "declined")


def test_401_without_an_api_key_or_with_an_unknown_one(api: httpx.Client, key: str):
    for user, extra in ((None, {}), ("user-0", {}), ("nobody", {})):
        response = post(api, key, user=user, **extra)
        assert response.status_code == 401, user
        assert response.json()["code"] == "idempotency_tenant_unknown"
    basic = api.post(
        "/v1/rides",
        json=RIDE,
        headers={"Idempotency-Key": key, "Authorization": "Basic dXNlci0xOg=="},
    )
    assert basic.status_code == 401
    # Nothing was stored: the key is still free for its owner.
    assert post(api, key).status_code == 201


def test_p7_a_missing_or_malformed_key_is_a_400(api: httpx.Client):
    missing = post(api, None)
    assert missing.status_code == 400
    assert missing.json()["code"] == "idempotency_key_missing"
    malformed = post(api, "x" * 256)
    assert malformed.status_code == 400
    assert malformed.json()["code"] == "idempotency_key_invalid"


def test_r5_an_invalid_ride_is_a_422_that_stores_nothing(
    api: httpx.Client, service: Service, key: str
):
    bad = {**RIDE, "origin_lat": 91, "target_lon": "east"}
    del bad["origin_lon"]

    refused = post(api, key, body=bad)

    assert refused.status_code == 422
    problem = refused.json()
    fields = {error["field"]: error["code"] for error in problem["errors"]}
    assert fields == {
        "origin_lat": "parameter_invalid",
        "origin_lon": "parameter_missing",
        "target_lon": "parameter_invalid",
    }
    assert "origin_lat must be between -90 and 90" in problem["detail"]
    assert service.charges(key) == []
    # The same key with the corrected body: not a mismatch, a first request.
    corrected = post(api, key)
    assert corrected.status_code == 201
    assert "idempotent-replayed" not in corrected.headers


def test_422_unknown_fields_and_non_objects_are_refused(api: httpx.Client, key: str):
    extra = post(api, key, body={**RIDE, "tip": 5})
    assert extra.status_code == 422
    assert [e["field"] for e in extra.json()["errors"]] == ["tip"]
    assert post(api, key, body=[1, 2]).status_code == 422


def test_p2_the_same_key_with_another_body_is_a_422_mismatch(api: httpx.Client, key: str):
    assert post(api, key).status_code == 201

    other = post(api, key, body={**RIDE, "target_lat": 48.0})

    assert other.status_code == 422
    assert other.json()["code"] == "idempotency_key_reused"


def test_p4_a_concurrent_duplicate_is_a_409(api: httpx.Client, service: Service, key: str):
    first: list[httpx.Response] = []
    slow = threading.Thread(
        target=lambda: first.append(post(api, key, **{DELAY_HEADER: "1.5"})),
    )
    slow.start()
    time.sleep(0.5)  # the first request holds the key, waiting to call the provider

    twin = post(api, key)

    slow.join()
    assert twin.status_code == 409
    assert twin.json()["code"] == "idempotency_key_in_use"
    assert int(twin.headers["retry-after"]) >= 1
    assert first[0].status_code == 201
    assert post(api, key).content == first[0].content
    assert len(service.charges(key)) == 1


def test_p7_a_body_over_8_kib_is_a_413(api: httpx.Client, key: str):
    response = post(api, key, body={**RIDE, "note": "x" * 9000})

    assert response.status_code == 413
    assert response.json()["code"] == "request_body_too_large"


def test_415_a_body_neither_json_nor_form(api: httpx.Client, key: str):
    response = api.post(
        "/v1/rides", content=b"origin_lat 1", headers=headers(key, **{"Content-Type": "text/plain"})
    )

    assert response.status_code == 415


def test_form_bodies_are_rides_too_and_fingerprint_by_their_pairs(
    api: httpx.Client, service: Service, key: str
):
    def form(pairs: list[tuple[str, object]]) -> httpx.Response:
        content = urllib.parse.urlencode(pairs)
        kind = {"Content-Type": "application/x-www-form-urlencoded"}
        return api.post("/v1/rides", content=content, headers=headers(key, **kind))

    first = form(list(RIDE.items()))
    reordered = form(list(reversed(RIDE.items())))
    as_json = post(api, key)

    assert first.status_code == 201
    assert first.json()["target_lon"] == RIDE["target_lon"]
    # The same pairs in another order are the same request (DESIGN 2)...
    assert reordered.headers["idempotent-replayed"] == "true"
    assert reordered.content == first.content
    # ...but the same ride as JSON is another request: the media type is hashed too.
    assert as_json.status_code == 422
    assert len(service.charges(key)) == 1


def test_get_lists_only_the_callers_rides(api: httpx.Client, key: str):
    mine = [post(api, f"{key}-{n}", user="user-77").json()["id"] for n in range(2)]
    theirs = post(api, f"{key}-x", user="user-78").json()["id"]

    listed = api.get("/v1/rides", headers=headers(None, user="user-77"))

    assert listed.status_code == 200
    ids = [ride["id"] for ride in listed.json()["data"]]
    assert set(mine) <= set(ids) and theirs not in ids
    assert ids == sorted(ids, reverse=True)
    assert api.get("/v1/rides").status_code == 401


def test_f4_a_worker_killed_mid_request_is_resumed_by_the_retry(
    api: httpx.Client, service: Service, key: str
):
    crashes = service.stack.crashes
    try:
        post(api, key, **{CRASH_HEADER: "charge:after"})
    except httpx.TransportError:
        pass  # the worker died with the request: charged, nothing recorded
    else:
        raise AssertionError("the worker should have died")
    assert len(service.charges(key)) == 1

    deadline = time.monotonic() + 10 * LOCK_TIMEOUT
    while True:  # the key stays locked for the lock timeout, then the retry takes over
        try:
            response = post(api, key)
        except httpx.TransportError:
            response = None  # the worker is restarting
        if response is not None and response.status_code != 409:
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)

    assert response.status_code == 201
    assert "idempotent-replayed" not in response.headers
    [charge] = service.charges(key)  # the provider deduplicated the resumed call (R4)
    assert response.json()["charge_id"] == charge["id"]
    assert service.stack.crashes == crashes + 1


def test_openapi_and_docs(api: httpx.Client):
    document = api.get("/openapi.json").json()

    assert document["openapi"].startswith("3.1")
    operation = document["paths"]["/v1/rides"]["post"]
    assert {"201", "400", "401", "402", "409", "413", "422"} <= set(operation["responses"])
    assert set(document["components"]["schemas"]["RideRequest"]["required"]) == set(RIDE)
    page = api.get("/docs")
    assert page.status_code == 200 and "/openapi.json" in page.text
    json.dumps(document)  # plain JSON all the way down


@pytest.fixture(scope="module")
def stripe_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A Rocket Rides in the Stripe wire profile (SQLite)."""
    data = tmp_path_factory.mktemp("rides-stripe")
    config = StackConfig(
        database=f"sqlite:///{data}/rides.sqlite3",
        data_dir=str(data),
        api_ports=(free_port(),),
        provider_port=free_port(),
        profile="stripe",
    )
    url = f"http://127.0.0.1:{config.api_ports[0]}"
    with (
        open(data / "processes.log", "wb") as log,
        start_stack(config, log) as stack,
        httpx.Client(base_url=url) as client,
    ):
        yield client
    assert_group_gone(stack.process.pid)


def test_the_stripe_profile_answers_like_stripe(stripe_api: httpx.Client, key: str):
    invalid = post(stripe_api, key, body={**RIDE, "origin_lon": 200})
    booked = post(stripe_api, key)
    reused = post(stripe_api, key, body={**RIDE, "target_lat": 1.0})
    declined = post(stripe_api, key + "-d", user="user-4-declined")

    assert invalid.status_code == 422
    assert invalid.json()["error"]["param"] == "origin_lon"
    assert booked.status_code == 201
    assert reused.status_code == 400  # Stripe's answer to a reused key
    assert reused.json()["error"]["code"] == "idempotency_key_reused"
    assert declined.status_code == 402
    assert declined.json()["error"]["type"] == "card_error"
