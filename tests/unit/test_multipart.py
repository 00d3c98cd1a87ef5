"""The canonical form of ``multipart/form-data`` bodies (DESIGN 2, P2): a browser picks
a new random boundary for each submit of the same form, so the fingerprint reads the
parts, not the bytes. Without the multipart branch in fingerprint.py the first test
fails (the raw bytes differ)."""

from __future__ import annotations

import pytest

from idempotence._multipart import parse_multipart
from idempotence.errors import InvalidBody
from idempotence.fingerprint import canonical_body, fingerprint


def form(boundary: str, *parts: tuple[str, str | None, bytes]) -> tuple[bytes, str]:
    body = b""
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        body += (
            f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"
        )
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_another_boundary_and_part_order_is_the_same_request() -> None:
    one = form("aaa", ("item", None, b"tea"), ("note", "n.txt", b"ring\r\ntwice"))
    two = form("bbbbbb", ("note", "n.txt", b"ring\r\ntwice"), ("item", None, b"tea"))
    assert one[0] != two[0]
    assert fingerprint("POST", "/o", *one) == fingerprint("POST", "/o", *two)


def test_a_changed_value_file_name_or_field_kind_is_another_request() -> None:
    base = fingerprint("POST", "/o", *form("x", ("item", None, b"tea")))
    assert base != fingerprint("POST", "/o", *form("x", ("item", None, b"tex")))
    assert base != fingerprint("POST", "/o", *form("x", ("item", "a.txt", b"tea")))
    assert base != fingerprint("POST", "/o", *form("x", ("item", None, b"tea"), ("n", None, b"")))


def test_a_file_and_a_field_of_one_name_compare_without_error() -> None:
    one = form("x", ("a", None, b"1"), ("a", "f.txt", b"1"))
    two = form("y", ("a", "f.txt", b"1"), ("a", None, b"1"))
    assert canonical_body(*one) == canonical_body(*two)


def test_excluded_fields_are_left_out() -> None:
    with_key = form("x", ("item", None, b"tea"), ("idempotency_key", None, b"k-1"))
    without = form("y", ("item", None, b"tea"))
    assert canonical_body(*with_key, exclude=["idempotency_key"]) == canonical_body(*without)


def test_parts_are_read_with_their_names_and_bytes() -> None:
    body, content_type = form("x", ("a", None, b"1"), ("f", "r\u00e9sum\u00e9.txt", b"\x00\xff"))
    parts = parse_multipart(body, content_type)
    assert [(p.name, p.filename, p.data) for p in parts] == [
        ("a", None, b"1"),
        ("f", "r\u00e9sum\u00e9.txt", b"\x00\xff"),
    ]


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (
            b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\nabc',
            "multipart/form-data; boundary=x",
            "closing boundary",
        ),
        (b"--x--\r\n", "multipart/form-data", "boundary"),
        (
            b"--x\r\nContent-Type: text/plain\r\n\r\nabc\r\n--x--",
            "multipart/form-data; boundary=x",
            "field name",
        ),
    ],
)
def test_a_body_that_is_not_a_form_is_refused(body: bytes, content_type: str, message: str) -> None:
    with pytest.raises(InvalidBody, match=message):
        fingerprint("POST", "/o", body, content_type)
