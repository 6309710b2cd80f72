"""`load_json` reads with msgspec first (streams.core.normalizers.base): whatever msgspec
accepts reads as the previous readers (orjson, else the standard library) read it, and
whatever it refuses is decided by them, with their reasons. Held here over arbitrary JSON
texts and hostile ones."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.normalizers.base import MalformedDelivery, _load_json_fast, load_json


def _outcome(read: Any, body: bytes | str) -> tuple[str, Any]:
    try:
        value = read(body) if read is load_json else read(body, _raw(body), "body")
    except MalformedDelivery as refused:
        return ("refused", str(refused))
    return ("read", _tokens(value))


def _tokens(value: Any) -> list[tuple[str, Any]]:
    """`value` as a flat list of (type, value) tokens, walked with a stack (any depth): equal
    for two values exactly when they are equal and of the same types (1, 1.0 and True
    differ; -0.0 and 0.0 differ)."""
    found: list[tuple[str, Any]] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.append(("dict", len(item)))
            for key, inner in reversed(list(item.items())):
                stack.append(inner)
                stack.append(("key", key))
        elif isinstance(item, list):
            found.append(("list", len(item)))
            stack.extend(reversed(item))
        elif isinstance(item, tuple):
            found.append(item)
        elif isinstance(item, float):
            found.append(("float", item.hex()))
        else:
            found.append((type(item).__name__, item))
    return found


def _raw(body: bytes | str) -> bytes:
    return body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body


def _same(body: bytes | str) -> None:
    if isinstance(body, str):
        try:
            body.encode("utf-8")
        except UnicodeEncodeError:
            with pytest.raises(MalformedDelivery, match="lone UTF-16 surrogate"):
                load_json(body)
            return
    assert _outcome(load_json, body) == _outcome(_load_json_fast, body)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**64 + 2)
    | st.integers(min_value=-(2**64), max_value=-(2**63) + 2)
    | st.integers(min_value=10**30, max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(JSON_VALUES, st.booleans())
def test_any_json_reads_as_before(value: Any, ascii_only: bool) -> None:
    _same(json.dumps(value, ensure_ascii=ascii_only).encode())


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=64) | st.text(max_size=32).map(lambda t: t.encode("utf-8", "surrogatepass"))
)
def test_any_bytes_read_or_refused_as_before(body: bytes) -> None:
    _same(body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"size": 123456789012345678901234567890}',
        b"[18446744073709551615, 18446744073709551616, -9223372036854775809]",
        b"1" * 4300,
        b"1" * 4301,
        b"1" * 400 + b".0",
        b"1e400",
        b"-1e400",
        b"NaN",
        b'{"a": Infinity}',
        b'"\\ud800"',
        b'{"\\udfff": 1}',
        b'"\xed\xa0\x80"',
        b'"\\ud83d\\ude00"',
        b'{"a": 1, "a": 2}',
        b"\xef\xbb\xbf{}",
        '{"a": 1}'.encode("utf-16"),
        '{"a": 1}'.encode("utf-32-le"),
        b"[" * 900 + b"]" * 900,
        b"[" * 1000 + b"]" * 1000,
        b"[" * 1024 + b"]" * 1024,
        b"[" * 1025 + b"]" * 1025,
        b"[" * 100_000,
        b'"a\x01b"',
        b"[1,]",
        b"{} x",
        b"",
        b"\xff",
        "\ud800",
        '{"Message": "x"}',
    ],
    ids=repr,
)
def test_hostile_bodies_read_or_refused_as_before(body: bytes | str) -> None:
    _same(body)
