"""The Redis store's own packing of its scripts (``_resp``): the bytes hiredis would
write, for every number and length of arguments; anything but bytes refused, so that
the lane packs it with hiredis; and a request's scripts sent as bytes only, so that
they take the packer."""

from __future__ import annotations

import json
import random
from datetime import timedelta

import pytest

hiredis = pytest.importorskip("hiredis")

from idempotence.states import ClaimRequest, Lease, StoredResponse  # noqa: E402
from idempotence.stores.redis._resp import evalsha_packed  # noqa: E402
from idempotence.stores.redis._store_shared import (  # noqa: E402
    claim_call,
    decimal,
    encode,
    encoded_record_key,
    finish_args,
)

SHA = "5d1a3d1e" * 5


def test_the_packed_command_is_hiredis_own() -> None:
    rng = random.Random(7)
    for _ in range(500):
        keys = [rng.randbytes(rng.choice([0, 1, 60, 2000])) for _ in range(rng.randint(0, 3))]
        args = [
            rng.randbytes(rng.choice([0, 1, 9, 1023, 1024, 70000]))
            for _ in range(rng.randint(0, 14))
        ]
        expected = hiredis.pack_command(("EVALSHA", SHA, len(keys), *keys, *args))
        assert evalsha_packed(SHA, keys, args) == expected


@pytest.mark.parametrize("odd", ["text", 7, 2.5, None])
def test_anything_but_bytes_is_refused_for_hiredis_to_pack(odd: object) -> None:
    with pytest.raises(TypeError):
        evalsha_packed(SHA, [b"k"], [b"v", odd])  # type: ignore[list-item]


def test_a_claim_and_a_finish_send_bytes_only() -> None:
    request = ClaimRequest(
        scope="acct",
        key="k-1",
        fingerprint="f" * 64,
        params={"amount": 3},
        lock_timeout=timedelta(seconds=30),
        retention=timedelta(days=1),
    )
    key, claim, record_id = claim_call(b"idem", request)
    assert all(type(arg) is bytes for arg in [key, *claim])
    assert claim[6] == b'{"amount":3}'
    assert claim[7:9] == [b"30000000", b"86400000000"]
    assert 0 < record_id < 2**62 + 1 and claim[9] == b"%d" % record_id
    response = StoredResponse.of(201, {"content-type": "application/json"}, b"{}")
    finish = finish_args(response, None, b"idem:settled")
    assert all(type(arg) is bytes for arg in finish)
    assert finish[0] == b"201"
    lease = Lease(id=2**61 + 5, scope="acct", key="k-1", token=3, recovery_point="started")
    assert (b"%d" % lease.id, decimal(lease.token), decimal(1234)) == (
        b"2305843009213693957",
        b"3",
        b"1234",
    )


@pytest.mark.parametrize(
    "headers",
    [
        (("content-type", "application/json"),),
        (("x-a", "é\u2028"), ("x-b", "")),
        [("x-list", "1")],
        (["x-inner", "list"],),
        (("x-number", 7),),
        (),
    ],
)
def test_a_finish_writes_the_headers_json_dumps_writes_again_and_again(headers: object) -> None:
    expected = json.dumps(headers).encode()
    response = StoredResponse(200, headers, b"")  # type: ignore[arg-type]
    for _ in range(3):  # the first writes them, the next may find them kept
        assert finish_args(response, None, b"idem:settled")[1] == expected


class _CaseBlind(str):
    """A header name that calls any spelling of itself equal (as a case-insensitive
    name type would), though it is written as spelled."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and self.lower() == other.lower()

    def __hash__(self) -> int:
        return hash(self.lower())


def test_headers_equal_to_kept_ones_by_a_str_subclass_are_written_as_they_are_spelled() -> None:
    kept = StoredResponse(200, (("content-type", "application/json"),), b"")
    assert finish_args(kept, None, b"idem:settled")[1] == b'[["content-type", "application/json"]]'
    spelled = StoredResponse(200, ((_CaseBlind("Content-Type"), "application/json"),), b"")
    assert spelled.headers == kept.headers  # equal, and hashed alike, so a lookup would hit
    for _ in range(2):
        written = finish_args(spelled, None, b"idem:settled")[1]
        assert written == b'[["Content-Type", "application/json"]]'


@pytest.mark.parametrize("text", ["acct", "", "café ☃ 𝄞", "lone \udcff surrogate", "\ud800"])
def test_a_claims_key_and_texts_are_encoded_as_surrogatepass_encodes_them(text: str) -> None:
    request = ClaimRequest(
        scope=text,
        key=text + "k",
        fingerprint=text,
        method=text,
        path=text,
        flow=text,
        lock_timeout=timedelta(seconds=30),
    )
    key, claim, _ = claim_call(b"idem", request)
    assert key == encoded_record_key(b"idem", text, text + "k")
    assert claim[:6] == [encode(part) for part in (text, text + "k", *[text] * 4)]
