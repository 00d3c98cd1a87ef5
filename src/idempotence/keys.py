"""Idempotency keys: validation (P7) and the ``Idempotency-Key`` header (P8).

A key is the client's opaque string: 1 to 255 printable ASCII characters (DESIGN 2).
The header arrives in one of two forms, and both are accepted:

* the IETF draft form, an RFC 8941 structured-field string: ``"8e03978e-..."``;
* the bare token form that Stripe clients send: ``8e03978e-...``.

Nothing here does I/O; the integrations turn the errors into 400 problem responses.
"""

from __future__ import annotations

from idempotence.errors import InvalidKey, MissingKey

__all__ = [
    "MAX_KEY_LENGTH",
    "format_idempotency_key_header",
    "parse_idempotency_key_header",
    "validate_key",
]

MAX_KEY_LENGTH = 255
"""The longest key accepted (DESIGN 2, P7)."""

# HTTP parsers strip optional whitespace (SP / HTAB) around a field value; a framework
# that hands us the raw value may not have, so we do it here.
_OWS = " \t"


_HEADER_SUBJECT = "The Idempotency-Key"


def validate_key(key: str, *, subject: str = _HEADER_SUBJECT) -> str:
    """Return ``key`` if it is a well-formed idempotency key, else raise
    [`InvalidKey`][idempotence.keys.InvalidKey].

    A key is 1 to 255 characters, each printable ASCII (0x20-0x7E), spaces included (P7).

    Args:
        key: The key to check.
        subject: What the error message calls the key, for a key that is not an
            HTTP header (as a function argument's, "this call's key").

    Returns:
        ``key``, unchanged.

    Raises:
        InvalidKey: ``key`` is empty, longer than 255 characters, or has a character
            outside printable ASCII; the message says which.

    ```python
    validate_key("8e03978e-40d5-43e8-bc93-6894a57f9324")
    # '8e03978e-40d5-43e8-bc93-6894a57f9324'
    validate_key("k" * 256)
    # Traceback (most recent call last):
    # idempotence.errors.InvalidKey: The Idempotency-Key is too long: 256 characters, max 255.
    ```
    """
    if not key:
        raise InvalidKey(f"{subject} is empty: send 1 to 255 printable ASCII characters.")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"{subject} is too long: {len(key)} characters, max {MAX_KEY_LENGTH}.")
    if key.isascii() and key.isprintable():
        return key  # printable ASCII is exactly 0x20-0x7E: the loop below, in C
    for position, char in enumerate(key):
        if not " " <= char <= "~":
            code = ord(char)
            # An HTTP header's bytes arrive decoded as latin-1: a client that sent UTF-8
            # knows its key by bytes, not by the characters latin-1 makes of them. A key
            # from elsewhere (a URL, an argument) is characters: no bytes to name.
            in_header = subject == _HEADER_SUBJECT and 0x7F < code <= 0xFF
            byte = f" (byte 0x{code:02X} in a header)" if in_header else ""
            raise InvalidKey(
                f"{subject} character at position {position} (0-based) is "
                f"U+{code:04X}{byte}, which is not printable ASCII: use only characters "
                "0x20 to 0x7E."
            )
    return key


def parse_idempotency_key_header(value: str | bytes | None, *, required: bool) -> str | None:
    """Extract and validate the key from an ``Idempotency-Key`` header value (P7, P8).

    ``value`` is the header as received (``None`` when absent); bytes are decoded as
    latin-1, as HTTP field bytes are. A value starting with ``"`` is parsed strictly as
    an RFC 8941 string (only ``\\"`` and ``\\\\`` escapes, nothing after the closing
    quote but whitespace); any other value is the bare key. Raises
    [`MissingKey`][idempotence.keys.MissingKey] when absent and ``required``,
    [`InvalidKey`][idempotence.keys.InvalidKey] when malformed (an empty value is
    malformed, not missing).

    ```python
    parse_idempotency_key_header('"abc-123"', required=True)
    # 'abc-123'
    parse_idempotency_key_header(b"8e03978e-40d5-43e8-bc93-6894a57f9324", required=True)
    # '8e03978e-40d5-43e8-bc93-6894a57f9324'
    parse_idempotency_key_header(None, required=False) is None
    # True
    ```
    """
    if value is None:
        if required:
            raise MissingKey()
        return None
    # latin-1 maps every byte to one character and never fails, so bytes 0x80-0xFF
    # become non-ASCII characters that validate_key rejects with their position.
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip(_OWS)
    key = _parse_sf_string(text) if text.startswith('"') else text
    return validate_key(key)


def format_idempotency_key_header(key: str) -> str:
    """Render ``key`` as the IETF draft's structured-field string, for clients and tests.

    ```python
    format_idempotency_key_header('say "hi"')
    # '"say \\\\"hi\\\\""'
    ```
    """
    validate_key(key)
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _parse_sf_string(text: str) -> str:
    """Parse an RFC 8941 sf-string that fills all of ``text`` (already OWS-stripped).

    Characters that sf-string forbids (controls, non-ASCII) are kept here and rejected
    by [`validate_key`][idempotence.keys.validate_key], whose message names the offending character.
    """
    chars: list[str] = []
    position = 1  # after the opening quote
    while position < len(text):
        char = text[position]
        if char == "\\":
            escaped = text[position + 1 : position + 2]
            if escaped == "":
                break  # a trailing backslash: the string never closes
            if escaped not in ('"', "\\"):
                # Echo a control or non-ASCII character by code point, never raw.
                shown = escaped if " " <= escaped <= "~" else f"U+{ord(escaped):04X}"
                raise InvalidKey(
                    f"The Idempotency-Key has an invalid escape \\{shown} at position "
                    f'{position} (0-based): inside quotes only \\" and \\\\ may be escaped.'
                )
            chars.append(escaped)
            position += 2
        elif char == '"':
            if position != len(text) - 1:
                raise InvalidKey(
                    "The Idempotency-Key has unexpected characters after its closing quote, "
                    f"from position {position + 1} (0-based): send one quoted string and "
                    "nothing else."
                )
            return "".join(chars)
        else:
            chars.append(char)
            position += 1
    raise InvalidKey(
        "The Idempotency-Key starts with a quote but has no closing quote: send "
        '"your-key" or your-key without quotes.'
    )
