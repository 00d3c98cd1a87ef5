"""Keys and the Idempotency-Key header (DESIGN 2, P7, P8)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idempotence.errors import InvalidKey, MissingKey, RequestError
from idempotence.keys import (
    MAX_KEY_LENGTH,
    format_idempotency_key_header,
    parse_idempotency_key_header,
    validate_key,
)

UUID = "8e03978e-40d5-43e8-bc93-6894a57f9324"
PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))
CONTROL = [chr(c) for c in range(0x20)] + ["\x7f"]

printable_keys = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    min_size=1,
    max_size=MAX_KEY_LENGTH,
)


def sf_string(key: str) -> str:
    """RFC 8941 sf-string serialisation, written independently of the library's."""
    out = ['"']
    for char in key:
        if char in '"\\':
            out.append("\\")
        out.append(char)
    out.append('"')
    return "".join(out)


def parse(value: str | bytes | None, *, required: bool = True) -> str | None:
    return parse_idempotency_key_header(value, required=required)


# -- validate_key (P7) ---------------------------------------------------------------


def test_p7_max_key_length_is_255() -> None:
    assert MAX_KEY_LENGTH == 255


@pytest.mark.parametrize("length", [1, 2, 254, 255])
def test_p7_key_of_valid_length_is_returned(length: int) -> None:
    key = "k" * length
    assert validate_key(key) is key


def test_p7_empty_key_is_invalid_and_says_empty() -> None:
    with pytest.raises(InvalidKey, match="empty"):
        validate_key("")


@pytest.mark.parametrize("length", [256, 257, 10_000])
def test_p7_too_long_key_names_its_length_and_the_maximum(length: int) -> None:
    with pytest.raises(InvalidKey) as info:
        validate_key("k" * length)
    assert f"too long: {length} characters, max 255" in str(info.value)


def test_p7_too_long_is_reported_before_bad_characters() -> None:
    with pytest.raises(InvalidKey, match="too long: 300 characters"):
        validate_key("\x00" * 300)


def test_p7_every_printable_ascii_character_is_accepted() -> None:
    for char in PRINTABLE:
        assert validate_key(char) == char
    for start in range(0, len(PRINTABLE), 50):
        assert validate_key(PRINTABLE[start : start + 50]) == PRINTABLE[start : start + 50]


def test_p7_space_is_printable_and_allowed_inside_a_key() -> None:
    assert validate_key("a b") == "a b"
    assert validate_key(" ") == " "


@pytest.mark.parametrize("char", CONTROL, ids=lambda c: f"U+{ord(c):04X}")
def test_p7_control_characters_and_del_are_rejected_with_position(char: str) -> None:
    with pytest.raises(InvalidKey) as info:
        validate_key(f"abc{char}def")
    message = str(info.value)
    assert "position 3" in message
    assert f"U+{ord(char):04X}" in message
    assert "not printable ASCII" in message
    # The raw character is never echoed back to the client.
    assert char not in message


def test_p7_a_utf8_key_sent_in_a_header_is_told_by_its_bytes() -> None:
    # "ключ" sent as UTF-8 arrives as latin-1 characters, one per byte.
    with pytest.raises(InvalidKey) as info:
        validate_key("ключ".encode().decode("latin-1"))
    assert "position 0" in str(info.value) and "byte 0xD0" in str(info.value)


@pytest.mark.parametrize(
    "char",
    ["é", "ÿ", "\x80", "\xa0", "€", "😀", "\u200b", "\ufeff", "\ud800"],
    ids=lambda c: f"U+{ord(c):04X}",
)
def test_p7_non_ascii_characters_are_rejected_with_position(char: str) -> None:
    with pytest.raises(InvalidKey) as info:
        validate_key(f"k{char}")
    assert "position 1" in str(info.value)
    assert f"U+{ord(char):04X}" in str(info.value)


def test_p7_first_bad_character_is_the_one_reported() -> None:
    with pytest.raises(InvalidKey, match="position 0"):
        validate_key("\tok\n")


def test_p7_key_errors_are_400_request_errors() -> None:
    assert issubclass(InvalidKey, RequestError)
    assert InvalidKey().status == 400
    assert MissingKey().status == 400


@given(printable_keys)
def test_p7_any_printable_ascii_key_of_valid_length_is_valid(key: str) -> None:
    assert validate_key(key) == key


@given(st.text(min_size=1, max_size=MAX_KEY_LENGTH))
def test_p7_a_key_is_valid_exactly_when_all_its_characters_are_printable_ascii(
    key: str,
) -> None:
    printable = all(0x20 <= ord(c) <= 0x7E for c in key)
    if printable:
        assert validate_key(key) == key
    else:
        with pytest.raises(InvalidKey):
            validate_key(key)


# -- the header: absent, empty ----------------------------------------------------------


def test_p7_missing_header_on_a_required_endpoint_is_missing_key() -> None:
    with pytest.raises(MissingKey) as info:
        parse(None, required=True)
    assert "Idempotency-Key" in str(info.value)


def test_p7_missing_header_on_an_optional_endpoint_is_none() -> None:
    assert parse(None, required=False) is None


@pytest.mark.parametrize("value", ["", b"", " ", "\t", " \t ", b"  "])
@pytest.mark.parametrize("required", [True, False])
def test_p7_empty_header_is_an_invalid_key_not_a_missing_one(
    value: str | bytes, required: bool
) -> None:
    with pytest.raises(InvalidKey, match="empty"):
        parse(value, required=required)


@pytest.mark.parametrize("required", [True, False])
def test_p8_empty_quoted_string_is_an_empty_key(required: bool) -> None:
    with pytest.raises(InvalidKey, match="empty"):
        parse('""', required=required)


# -- the bare token form (P8, Stripe clients) --------------------------------------------


def test_p8_bare_uuid_is_accepted() -> None:
    assert parse(UUID) == UUID


def test_p8_bare_uuid_as_bytes_is_accepted() -> None:
    assert parse(UUID.encode()) == UUID


@pytest.mark.parametrize("padding", [" ", "\t", "  \t", "\t \t"])
def test_p8_bare_form_strips_surrounding_spaces_and_tabs(padding: str) -> None:
    assert parse(f"{padding}{UUID}{padding}") == UUID
    assert parse(f"{padding}{UUID}") == UUID
    assert parse(f"{UUID}{padding}") == UUID


def test_p8_bare_form_keeps_inner_spaces_and_quotes_verbatim() -> None:
    assert parse("order 42") == "order 42"
    assert parse('say"hi"') == 'say"hi"'
    assert parse("back\\slash") == "back\\slash"
    assert parse("a=b;c") == "a=b;c"


def test_p8_bare_form_does_not_strip_other_whitespace() -> None:
    with pytest.raises(InvalidKey, match="position 0"):
        parse("\nabc")
    with pytest.raises(InvalidKey, match="position 3"):
        parse("abc\r\n")


def test_p8_bare_form_length_limits_apply_after_stripping() -> None:
    assert parse(" " + "k" * 255 + " ") == "k" * 255
    with pytest.raises(InvalidKey, match="too long: 256 characters"):
        parse("k" * 256)


@pytest.mark.parametrize("length", [0, 256, 10_000])
def test_p7_bare_form_rejects_bad_lengths(length: int) -> None:
    with pytest.raises(InvalidKey):
        parse("k" * length)


# -- the structured-field string form (P8, IETF draft) ---------------------------------


@pytest.mark.parametrize(
    ("header", "key"),
    [
        (f'"{UUID}"', UUID),
        ('"a"', "a"),
        ('"with space"', "with space"),
        ('"say \\"hi\\""', 'say "hi"'),
        ('"back\\\\slash"', "back\\slash"),
        ('"\\\\"', "\\"),
        ('"\\""', '"'),
        ('"\\\\\\""', '\\"'),
        ('"a;b=c"', "a;b=c"),
        ('"it\'s"', "it's"),
    ],
)
def test_p8_quoted_form_is_unescaped(header: str, key: str) -> None:
    assert parse(header) == key
    assert parse(header.encode("ascii")) == key


@pytest.mark.parametrize("padding", [" ", "\t", " \t "])
def test_p8_quoted_form_allows_surrounding_spaces_and_tabs(padding: str) -> None:
    assert parse(f'{padding}"{UUID}"{padding}') == UUID


def test_p8_spaces_inside_quotes_are_part_of_the_key() -> None:
    assert parse('"  abc  "') == "  abc  "


def test_p8_quoted_form_length_counts_the_unescaped_key() -> None:
    # 255 backslashes need 510 escaped characters on the wire but make a 255-char key.
    assert parse(sf_string("\\" * 255)) == "\\" * 255
    with pytest.raises(InvalidKey, match="too long: 256 characters"):
        parse(sf_string('"' * 256))


@pytest.mark.parametrize(
    ("header", "shown", "position"),
    [
        ('"\\n"', "\\n", 1),
        ('"ab\\t"', "\\t", 3),
        ('"\\x41"', "\\x", 1),
        ('"\\u0041"', "\\u", 1),
        ('"\\\'"', "\\'", 1),
        ('"\\/"', "\\/", 1),
        ('"\\ "', "\\ ", 1),
        ('"a\\\tb"', "\\U+0009", 2),
        ('"a\\\x00"', "\\U+0000", 2),
        ('"\\é"', "\\U+00E9", 1),
    ],
)
def test_p8_any_escape_other_than_quote_and_backslash_is_rejected(
    header: str, shown: str, position: int
) -> None:
    with pytest.raises(InvalidKey) as info:
        parse(header)
    message = str(info.value)
    assert f"invalid escape {shown} at position {position}" in message
    assert '\\" and \\\\' in message


@pytest.mark.parametrize(
    "header", ['"', '"abc', '"abc\\"', '"abc\\', '"\\', '"\\\\\\"', ' "abc ', '"abc\\"  ']
)
def test_p8_unterminated_quoted_string_is_rejected(header: str) -> None:
    with pytest.raises(InvalidKey, match="no closing quote"):
        parse(header)


@pytest.mark.parametrize(
    ("header", "position"),
    [
        ('"abc"x', 5),
        ('"abc";p=1', 5),
        ('"abc"; p=1', 5),
        ('"a" "b"', 3),
        ('"a""b"', 3),
        ('"a",', 3),
        ('"abc"\r', 5),
        ('"abc"\n', 5),
        ('"" ', None),  # trailing space is stripped: this is the empty key
    ],
)
def test_p8_garbage_after_the_closing_quote_is_rejected(header: str, position: int | None) -> None:
    with pytest.raises(InvalidKey) as info:
        parse(header)
    if position is None:
        assert "empty" in str(info.value)
    else:
        assert f"after its closing quote, from position {position}" in str(info.value)


@pytest.mark.parametrize("char", CONTROL, ids=lambda c: f"U+{ord(c):04X}")
def test_p8_control_characters_inside_quotes_are_rejected(char: str) -> None:
    with pytest.raises(InvalidKey, match=re.escape(f"U+{ord(char):04X}")):
        parse(f'"ab{char}cd"')


def test_p8_tab_inside_quotes_is_rejected() -> None:
    with pytest.raises(InvalidKey, match=r"position 2 .*U\+0009"):
        parse('"ab\tcd"')


@pytest.mark.parametrize("char", ["é", "😀", "\x85", "\xff"])
def test_p8_non_ascii_inside_quotes_is_rejected(char: str) -> None:
    with pytest.raises(InvalidKey, match=f"U\\+{ord(char):04X}"):
        parse(f'"{char}"')


# -- bytes (P8: HTTP field bytes) ---------------------------------------------------------


@pytest.mark.parametrize("byte", range(0x80, 0x100), ids=lambda b: f"0x{b:02X}")
def test_p8_non_ascii_header_bytes_are_an_invalid_key_never_a_decode_error(byte: int) -> None:
    for header in (b"ab" + bytes([byte]), b'"ab' + bytes([byte]) + b'"'):
        with pytest.raises(InvalidKey) as info:
            parse(header)
        # latin-1 decoding maps byte 0xNN to U+00NN, so the message names the byte.
        assert f"U+00{byte:02X}" in str(info.value)
        assert "position 2" in str(info.value)


def test_p8_utf8_encoded_key_bytes_are_rejected_not_decoded() -> None:
    with pytest.raises(InvalidKey, match="U\\+00C3"):
        parse("clé".encode())


@pytest.mark.parametrize("byte", [*range(0x20), 0x7F], ids=lambda b: f"0x{b:02X}")
def test_p8_control_bytes_are_rejected(byte: int) -> None:
    if byte == 0x09:  # a tab at either end is optional whitespace
        assert parse(b"\tk\t") == "k"
        return
    with pytest.raises(InvalidKey, match=f"U\\+00{byte:02X}"):
        parse(b"k" + bytes([byte]) + b"k")


# -- round trips (P8) -------------------------------------------------------------------


@given(printable_keys)
def test_p8_any_valid_key_round_trips_through_the_sf_string_form(key: str) -> None:
    header = sf_string(key)
    assert parse(header) == key
    assert parse(header.encode("latin-1")) == key
    assert parse(f" \t{header}\t ") == key


@given(printable_keys)
def test_p8_format_header_matches_the_sf_string_form_and_round_trips(key: str) -> None:
    header = format_idempotency_key_header(key)
    assert header == sf_string(key)
    assert parse(header) == key


@given(printable_keys.filter(lambda k: not k.startswith('"') and k == k.strip(" ")))
def test_p8_any_valid_key_round_trips_through_the_bare_form(key: str) -> None:
    assert parse(key) == key
    assert parse(key.encode("ascii")) == key
    assert parse(f"  {key}\t") == key


@given(st.text(max_size=300))
def test_p8_parsing_never_raises_anything_but_a_request_error(value: str) -> None:
    try:
        key = parse(value)
    except RequestError:
        return
    assert key is not None
    assert validate_key(key) == key


@given(st.binary(max_size=300))
def test_p8_parsing_bytes_never_raises_anything_but_a_request_error(value: bytes) -> None:
    try:
        key = parse(value)
    except RequestError:
        return
    assert key is not None
    assert key.encode("ascii")


def test_p8_format_header_validates_the_key() -> None:
    with pytest.raises(InvalidKey):
        format_idempotency_key_header("")
    with pytest.raises(InvalidKey):
        format_idempotency_key_header("é")
