"""Reading ``multipart/form-data`` bodies (RFC 7578), without I/O.

Two things need a form's fields: the fingerprint, because a browser that submits the
same form twice picks a new random boundary each time (the raw bytes differ, the
request does not), and a key taken from a form field (`Policy.key_field`). Only what
those two need is read: each part's name, file name, content type and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message
from email.utils import collapse_rfc2231_value

from .errors import InvalidBody

__all__ = ["FORM_DATA", "Part", "boundary_of", "parse_multipart"]

FORM_DATA = "multipart/form-data"


@dataclass(frozen=True, slots=True)
class Part:
    """One field of a ``multipart/form-data`` body."""

    name: str
    filename: str | None
    content_type: str | None
    data: bytes


def boundary_of(content_type: str | None) -> bytes:
    """The boundary parameter of a ``multipart/form-data`` Content-Type.

    Raises [`InvalidBody`][idempotence.errors.InvalidBody] when there is none.
    """
    message = Message()
    message["content-type"] = content_type or ""
    boundary = message.get_param("boundary")
    if not isinstance(boundary, str) or not 1 <= len(boundary) <= 70:
        raise InvalidBody(
            "The multipart/form-data request has no usable boundary in its Content-Type:"
            " send one of 1 to 70 characters (RFC 2046)."
        )
    return boundary.encode("latin-1", "replace")


def parse_multipart(body: bytes, content_type: str | None) -> list[Part]:
    """The parts of a ``multipart/form-data`` body, in the order sent.

    Raises [`InvalidBody`][idempotence.errors.InvalidBody] when the body is not one:
    no closing boundary, a part without headers' end or without a field name.
    """
    delimiter = b"\r\n--" + boundary_of(content_type)
    # Prepending CRLF lets the first delimiter match like the others (no preamble).
    segments = (b"\r\n" + body).split(delimiter)
    parts: list[Part] = []
    for segment in segments[1:]:
        if segment.startswith(b"--"):
            return parts  # the close delimiter: what follows is an epilogue
        # Transport padding (spaces, tabs) may follow a delimiter before its CRLF.
        segment = segment.lstrip(b" \t")
        if not segment.startswith(b"\r\n"):
            break
        head, separator, data = segment[2:].partition(b"\r\n\r\n")
        if not separator:
            # A part with no headers at all begins with the blank line itself.
            if not head.startswith(b"\r\n") and head:
                raise InvalidBody("A part of the multipart/form-data body has no end of headers.")
            head, data = b"", head[2:]
        parts.append(_part(head, data))
    raise InvalidBody(
        "The multipart/form-data body does not end with its closing boundary: send the whole form."
    )


def _part(head: bytes, data: bytes) -> Part:
    message = Message()
    for line in head.decode("utf-8", "surrogateescape").split("\r\n"):
        header, colon, value = line.partition(":")
        if colon:
            message[header.strip()] = value.strip()
    name = _param(message, "name")
    filename = _param(message, "filename")
    if name is None:
        raise InvalidBody(
            "A part of the multipart/form-data body has no field name: "
            'send Content-Disposition: form-data; name="...".'
        )
    return Part(
        name=name,
        filename=filename,
        content_type=message.get("content-type"),
        data=data,
    )


def _param(message: Message, name: str) -> str | None:
    value = message.get_param(name, header="content-disposition")
    if isinstance(value, tuple):  # an RFC 2231 encoded value (filename*=utf-8''...)
        return collapse_rfc2231_value(value)
    return value


def canonical_multipart(body: bytes, content_type: str | None, exclude: frozenset[str]) -> bytes:
    """The form's parts, minus the excluded names, sorted and length-prefixed: the
    same bytes whatever boundary or part order the client chose."""
    framed = bytearray()
    kept = [p for p in parse_multipart(body, content_type) if p.name not in exclude]
    # None never meets a str in the comparison: a file part and a plain field may share
    # a name.
    kept.sort(
        key=lambda p: (
            p.name,
            p.filename or "",
            p.filename is not None,
            p.content_type or "",
            p.data,
        )
    )
    for part in kept:
        for piece in (
            part.name.encode("utf-8", "surrogateescape"),
            # A file part and a plain field of the same bytes are different fields.
            b"\x00"
            if part.filename is None
            else b"\x01" + part.filename.encode("utf-8", "surrogateescape"),
            (part.content_type or "").encode("utf-8", "surrogateescape"),
            part.data,
        ):
            framed += len(piece).to_bytes(8, "big") + piece
    return bytes(framed)
