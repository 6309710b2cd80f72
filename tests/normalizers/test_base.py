"""The helpers every normalizer shares (streams.core.normalizers.base)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote_plus

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.normalizers.base import (
    MalformedDelivery,
    change_id,
    derived_id,
    load_json,
    optional_int,
    parse_time,
    present,
    record_hash_id,
    reject_lone_surrogates,
    strip_quotes,
)
from streams.core.normalizers.keys import form_decode

# --- load_json ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "body is not JSON"),
        (b"\xff", "body is not JSON"),
        (b"[" * 100_000, "body is nested too deeply"),
        (b"[NaN]", "non-finite number NaN"),
        (b"[-Infinity]", "non-finite number -Infinity"),
        (b"[1e400]", "non-finite number 1e400"),
        (b"[" + b"1" * 5000 + b"]", "body is not usable JSON"),
        (b'"\\ud800"', "lone UTF-16 surrogate"),
        (b'{"\\uDC00": 1}', "lone UTF-16 surrogate"),
        (b'{"a": [{"b": "x\\udfffy"}]}', "lone UTF-16 surrogate"),
        (b"[" * 900 + b'"\\ud800"' + b"]" * 900, "lone UTF-16 surrogate"),
        ('{"a": "\\ud800"}'.encode("utf-16"), "lone UTF-16 surrogate"),
        ('"\ud800"', "lone UTF-16 surrogate"),  # str input with a surrogate character
    ],
)
def test_load_json_refuses_what_no_normalizer_can_use(body: bytes | str, message: str) -> None:
    with pytest.raises(MalformedDelivery, match=message):
        load_json(body)


def test_load_json_names_what_it_read() -> None:
    with pytest.raises(MalformedDelivery, match="SNS Message is not JSON"):
        load_json("nope", "SNS Message")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"a": [1, 2.5, "\\u00e9"]}', {"a": [1, 2.5, "é"]}),
        (b'"\\ud83d\\ude00"', "\U0001f600"),  # an escaped pair is one character
        (b'"\\\\ud800"', "\\ud800"),  # an escaped backslash, not a surrogate
        ('{"a": "\\ud83d\\ude00"}'.encode("utf-16"), {"a": "\U0001f600"}),
    ],
)
def test_load_json_keeps_valid_documents(body: bytes, expected: Any) -> None:
    assert load_json(body) == expected


@pytest.mark.parametrize(
    "body",
    [
        b"[18446744073709551615, 18446744073709551616, -9223372036854775808]",
        b"[-9223372036854775809, 123456789012345678901234567890]",
        b'{"size": 99999999999999999999}',
        b'{"a": [1,\n  -99999999999999999999]}',
        b"  18446744073709551616 ",
        b'{"Records": [{"s3": {"object": {"size":\t\r\n 100000000000000000000}}}]}',
    ],
)
def test_load_json_keeps_integers_beyond_64_bits_exact(body: bytes) -> None:
    # orjson reads these as floats; load_json must give what json.loads gives.
    value = load_json(body)
    assert value == json.loads(body)
    assert json.dumps(value) == json.dumps(json.loads(body))


@pytest.mark.parametrize(
    "body",
    [
        b'{"configurationId": "tf-s3-queue-20180307174600377300000002", "size": 5}',
        b'{"sequencer": "0000000000000000000000000000201B00000000004092a5"}',
    ],
)
def test_digit_runs_inside_strings_read_as_usual(body: bytes) -> None:
    assert load_json(body) == json.loads(body)


@pytest.mark.parametrize(
    "body",
    [
        b'\xef\xbb\xbf{"a": 1}',  # a UTF-8 BOM, which orjson refuses
        '{"a": [1, "\u00e9"]}'.encode("utf-32"),
    ],
)
def test_load_json_reads_what_orjson_refuses_as_json_does(body: bytes) -> None:
    assert load_json(body) == json.loads(body)


def test_load_json_refuses_a_surrogate_spelt_in_utf8_bytes() -> None:
    # json.loads decodes ED A0 80 to "\ud800" instead of refusing it.
    with pytest.raises(MalformedDelivery, match="lone UTF-16 surrogate"):
        load_json(b'{"key": "a\xed\xa0\x80"}')


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=20,
    ),
    st.sampled_from([None, 2]),
)
def test_load_json_reads_any_document_as_json_loads_does(value: Any, indent: int | None) -> None:
    body = json.dumps(value, indent=indent).encode()
    try:
        expected = json.loads(body)
    except ValueError:
        return  # an integer beyond Python's digit limit: refused (tested above)
    if any(0xD800 <= ord(char) <= 0xDFFF for char in json.dumps(value, ensure_ascii=False)):
        return  # a lone surrogate: refused (tested above)
    if "Infinity" in body.decode():
        return  # a float that json.dumps wrote as Infinity: refused (tested above)
    assert json.dumps(load_json(body)) == json.dumps(expected)


def test_reject_lone_surrogates_walks_keys_and_values() -> None:
    reject_lone_surrogates({"a": ["b", {"c": "d"}]}, "attributes")
    with pytest.raises(MalformedDelivery, match="attributes holds a lone UTF-16 surrogate"):
        reject_lone_surrogates({"a": ["b", {"c\udc00": "d"}]}, "attributes")


# --- values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("etag", "expected"),
    [
        (None, None),
        ("", None),
        ('""', None),
        ('"abc"', "abc"),
        ('""abc""', '"abc"'),
        ("abc", "abc"),
        ('"', '"'),
        ('"abc', '"abc'),
    ],
)
def test_strip_quotes_removes_one_pair(etag: str | None, expected: str | None) -> None:
    assert strip_quotes(etag) == expected


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("", None), ("a", "a")])
def test_present_treats_empty_as_absent(value: Any, expected: str | None) -> None:
    assert present(value, "field") == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("", None), (7, 7), ("42", 42), (3.0, 3)]
)
def test_optional_int_reads_numbers_and_decimal_strings(value: Any, expected: int | None) -> None:
    assert optional_int(value, "size") == expected


@pytest.mark.parametrize("value", [True, "²", "١٢", "9" * 31, "1e3", "-1", 1.5, [], float("inf")])
def test_optional_int_refuses_everything_else(value: Any) -> None:
    with pytest.raises(MalformedDelivery, match="size is not an integer"):
        optional_int(value, "size")


# --- times ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("2024-01-02T03:04:05Z", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2024-01-02T03:04:05.1234567Z", datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
        ("2024-01-02T04:04:05.5+01:00", datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)),
    ],
)
def test_parse_time_gives_utc(value: Any, expected: datetime | None) -> None:
    assert parse_time(value, "time") == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (5, "time is not a string"),
        ("yesterday", "time is not an RFC 3339 time"),
        ("0001-01-01T00:00:00+01:00", "time is out of range"),
        ("9999-12-31T23:59:59-01:00", "time is out of range"),
    ],
)
def test_parse_time_refusals_say_why(value: Any, message: str) -> None:
    with pytest.raises(MalformedDelivery, match=message):
        parse_time(value, "time")


@pytest.mark.parametrize(
    "value",
    [
        "2024-01-02.03:04:05Z",  # fromisoformat takes `.` as the separator; RFC 3339 does not
        "2024-01-02.03:04:05.123+01:00",
    ],
)
def test_parse_time_refuses_a_dot_between_date_and_time(value: str) -> None:
    with pytest.raises(MalformedDelivery, match="not an RFC 3339 time"):
        parse_time(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2024-01-02T03:04:05z", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
        (" 2024-01-02T03:04:05Z ", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2024-01-02T03:04:05", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),  # naive: UTC
        ("2024-01-02 03:04:05.5-02:00", datetime(2024, 1, 2, 5, 4, 5, 500000, tzinfo=UTC)),
    ],
)
def test_parse_time_reads_what_fromisoformat_alone_would_not(
    value: str, expected: datetime
) -> None:
    parsed = parse_time(value)
    assert parsed == expected
    assert parsed is not None and parsed.tzinfo is UTC


def test_parse_time_reads_a_huge_fraction_in_linear_time() -> None:
    value = "2024-01-02T03:04:05." + "1" * 200_000 + "Z"
    assert parse_time(value) == datetime(2024, 1, 2, 3, 4, 5, 111111, tzinfo=UTC)


# --- ids ------------------------------------------------------------------------------------


def test_change_id_prefers_the_version_then_time_and_etag_then_the_record() -> None:
    time = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    record = {"k": 1}
    assert change_id("p", "put", "b", "k", "v1", time, "e", record) == derived_id(
        "p", "put", "b", "k", "v1"
    )
    assert change_id("p", "put", "b", "k", None, time, "e", record) == derived_id(
        "p", "put", "b", "k", None, "2024-01-02T03:04:05Z", "e"
    )
    assert change_id("p", "put", "b", "k", None, None, "e", record) == derived_id(
        "p", "put", "b", "k", None, None, "e"
    )
    assert change_id("p", "put", "b", "k", None, None, None, record) == record_hash_id("p", record)


def _derived_id_by_json(provider: str, *parts: str | int | None) -> str:
    """derived_id as first written, with the standard library's JSON."""
    material = json.dumps([provider, *parts], ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{provider}:{digest[:32]}"


@pytest.mark.parametrize(
    "parts",
    [
        ("ObjectCreated:Put", "bucket", "key", "0055AED6DCD90281E5"),
        ("put", None, 'a/\u00e9\u4f60\U0001f431 "q" \\ \x00\x1f\x7f\u2028', None, "e"),
        ("put", "b", "k", 2**63 - 1, -(2**63), 0),
        ("put", "b", "k", 2**64 + 1),  # beyond orjson's integers
        ("put", "b", "k\ud800"),  # a lone surrogate, which orjson cannot write
    ],
)
def test_derived_id_is_what_it_always_was(parts: tuple[str | int | None, ...]) -> None:
    assert derived_id("s3", *parts) == _derived_id_by_json("s3", *parts)


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.none() | st.text() | st.integers(), max_size=6))
def test_derived_id_is_what_it_always_was_for_any_parts(parts: list[str | int | None]) -> None:
    assert derived_id("p", *parts) == _derived_id_by_json("p", *parts)


# --- keys -----------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None, database=None)
@given(
    st.lists(
        st.sampled_from(["a", "+", "%", "%2", "%41", "%zz", "%C3%A9", "%E4%BD%A0", "%C3", "é", " "])
        | st.text(max_size=3),
        max_size=8,
    ).map("".join)
)
def test_form_decode_is_unquote_plus(key: str) -> None:
    try:
        expected = unquote_plus(key, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        with pytest.raises(MalformedDelivery, match="not valid percent-encoded UTF-8"):
            form_decode(key)
    else:
        assert form_decode(key) == expected
