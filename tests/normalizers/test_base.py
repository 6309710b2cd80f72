"""The helpers every normalizer shares (streams.normalizers.base)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from streams.normalizers.base import (
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
