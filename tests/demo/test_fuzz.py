"""Whatever a client posts to ``POST /v1/rides``, the answer is never a 5xx.

Generated bodies: random JSON values, the ride's fields with wrong types, huge and
tiny numbers, NaN and Infinity (in JSON and as strings), missing and extra fields,
form bodies with arbitrary pairs, and raw bytes under either content type. Each goes
out with a fresh key through the real server, on both backends.
"""

from __future__ import annotations

import json
import urllib.parse
import uuid

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rocket_rides.rides import FIELDS
from tests.demo.conftest import Service

#: The slow tier: the demo under a fuzzed workload.
pytestmark = pytest.mark.slow

_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([10**400, -(10**400), 1e308, -0.0, 90, -90, 180, -180, 90.0000001]),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    _numbers,
    st.text(max_size=20),
    st.sampled_from(["NaN", "nan", "Infinity", "-inf", "1e400", "12.5", " 7 ", "0x10", ""]),
)
_json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_ride_like = st.fixed_dictionaries(
    {},
    optional={field: _json_values for field in FIELDS}
    | {"extra": _json_values, "origin": _json_values},
)


def _encode(value: object) -> bytes:
    # json.dumps writes NaN and Infinity as bare words: not JSON, which is the point.
    return json.dumps(value, allow_nan=True).encode()


_bodies = st.one_of(
    _ride_like.map(lambda body: ("application/json", _encode(body))),
    _json_values.map(lambda body: ("application/json", _encode(body))),
    st.lists(st.tuples(st.sampled_from([*FIELDS, "x", ""]), st.text(max_size=12)), max_size=6).map(
        lambda pairs: ("application/x-www-form-urlencoded", urllib.parse.urlencode(pairs).encode())
    ),
    st.tuples(
        st.sampled_from(["application/json", "application/x-www-form-urlencoded", "text/plain"]),
        st.binary(max_size=64),
    ),
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=_bodies)
# Inputs that once broke something somewhere: a number too large for a float, NUL and a
# lone surrogate (PostgreSQL's jsonb refuses both), an integer past Python's digit limit.
@example(body=("application/json", b'{"origin_lat": 1e400, "origin_lon": -1e400}'))
@example(
    body=("application/json", b'{"\\u0000": 1, "\\ud800": "\\ud800", "origin_lat": "\\u0000"}')
)
@example(body=("application/json", b'{"origin_lat": 1' + b"0" * 5000 + b"}"))
@example(body=("application/x-www-form-urlencoded", b"origin_lat=%00&%ff%fe=1&origin_lon=NaN"))
def test_no_generated_body_gets_a_5xx(service: Service, body: tuple[str, bytes]):
    content_type, content = body
    response = httpx.post(
        service.api + "/v1/rides",
        content=content,
        headers={
            "Authorization": "Bearer user-9",
            "Idempotency-Key": f"fuzz-{uuid.uuid4().hex}",
            "Content-Type": content_type,
        },
        timeout=15.0,
    )

    assert response.status_code < 500, response.text
    assert response.status_code in (201, 400, 413, 415, 422), response.text
    if response.status_code != 201:
        problem = response.json()
        assert problem["detail"] and problem["code"]
