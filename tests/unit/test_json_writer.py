"""JSON writers made once (`idempotence._json`): what ``json.dumps`` writes, byte for
byte, with the same options: stored headers, canonical bodies and a guarded
function's arguments and results depend on it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idempotence._json import writer
from tests.unit.test_fingerprint import scalars

values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@given(
    value=values,
    sort_keys=st.booleans(),
    ensure_ascii=st.booleans(),
    allow_nan=st.booleans(),
    compact=st.booleans(),
)
def test_a_writer_writes_what_json_dumps_does(
    value: Any, sort_keys: bool, ensure_ascii: bool, allow_nan: bool, compact: bool
) -> None:
    write = writer(
        sort_keys=sort_keys, ensure_ascii=ensure_ascii, allow_nan=allow_nan, compact=compact
    )
    separators = (",", ":") if compact else (", ", ": ")
    assert write(value) == json.dumps(
        value,
        sort_keys=sort_keys,
        ensure_ascii=ensure_ascii,
        allow_nan=allow_nan,
        separators=separators,
    )


def test_it_refuses_what_json_dumps_refuses() -> None:
    with pytest.raises(ValueError, match="Out of range float"):
        writer(allow_nan=False)({"amount": float("nan")})
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        writer()({1, 2})
    assert writer(default=sorted)({3, 1}) == "[1, 3]"
