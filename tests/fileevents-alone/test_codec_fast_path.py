"""`decode_event` reads with msgspec first (fileevents.codec._decode_event_fast): every value
is read or refused exactly as `_decode_event_validated` (orjson, then pydantic) reads or
refuses it: the same event (equal, every field of the same type, the same `model_dump_json`
and fields set, `time` in `timezone.utc`) or the same error and message. Held here over
events as the stream writes them, mutations of them, hostile values and arbitrary JSON.

Part of the distribution's own suite (dev/fileevents-alone.sh), so it holds on Python 3.10
and 3.13 with the msgspec their fresh environments resolve, not only on the repository's."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fileevents.codec import (
    FAST_RAW_LEVELS,
    MAX_DEPTH,
    _decode_event_fast,
    _decode_event_validated,
    decode_event,
)
from fileevents.errors import EventDecodeError
from fileevents.event import UTC, FileEvent  # UTC: 3.10 has no datetime.UTC


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
                stack.append(("key", type(key).__name__, key))
        elif isinstance(item, list):
            found.append(("list", len(item)))
            stack.extend(reversed(item))
        elif isinstance(item, tuple):
            found.append(item)
        elif isinstance(item, float):
            found.append(("float", item.hex()))
        elif isinstance(item, datetime):
            found.append(("datetime", (type(item), item, item.tzinfo is UTC, item.fold)))
        else:
            found.append((type(item).__name__, item))
    return found


def _outcome(read: Any, value: bytes | None) -> tuple[Any, ...]:
    try:
        event = read(value)
    except EventDecodeError as refused:
        return ("refused", str(refused))
    except Exception as raised:  # whatever it is, both must raise it alike
        return ("raised", type(raised).__name__, str(raised))
    assert type(event) is FileEvent
    return (
        "read",
        [(name, _tokens(getattr(event, name))) for name in FileEvent.model_fields],
        event.model_dump_json(),
        sorted(event.model_fields_set),
    )


def _same(value: bytes | None) -> tuple[Any, ...]:
    """Assert that decode_event decides `value` as the validated path does; its outcome."""
    expected = _outcome(_decode_event_validated, value)
    assert _outcome(decode_event, value) == expected
    if value is not None:  # what the fast path returns at all is the validated path's event
        try:
            fast = _decode_event_fast(value)
        except Exception:  # it may refuse anything; decode_event falls back
            fast = None
        if fast is not None:
            assert _outcome(lambda _: fast, value) == expected
    return expected


def _nested(depth: int) -> Any:
    """A JSON value nested `depth` levels (objects and arrays alternating), depth >= 1."""
    node: Any = {}
    for level in range(depth - 1):
        node = {"a": node} if level % 2 else [node]
    return node


def _nested_text(depth: int) -> bytes:
    """`_nested(depth)` as JSON text, at any depth (json.dumps recurses)."""
    opening = [b"[" if level % 2 == 0 else b'{"a":' for level in reversed(range(depth - 1))]
    closing = [b"]" if level % 2 == 0 else b"}" for level in range(depth - 1)]
    return b"".join(opening) + b"{}" + b"".join(closing)


def _written(**fields: Any) -> bytes:
    """A record value as the stream writes it (`FileEvent.model_dump_json`)."""
    base: dict[str, Any] = {
        "id": "s3:uploads/a.jpg:1",
        "type": "created",
        "key": "uploads/a.jpg",
        "bucket": "uploads",
        "size": 1000,
        "etag": "9b2cf535f27731c974343645a3985328",
        "version_id": None,
        "time": datetime(2026, 12, 1, 0, 0, 0, 1000, tzinfo=UTC),
        "sequencer": "0000000000000001",
        "provider": "s3",
        "version_only": None,
        "raw": {"eventName": "ObjectCreated:Put", "s3": {"object": {"size": 1000}}},
    }
    return FileEvent(**{**base, **fields}).model_dump_json().encode()


def _text(document: Any, ascii_only: bool = True) -> bytes:
    """`document` as JSON text; a lone surrogate as an escape or as its UTF-8-style bytes."""
    return json.dumps(document, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


# -- events as the stream writes them ---------------------------------------------------

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**64 + 2)
    | st.integers(min_value=-(2**64), max_value=-(2**63) + 2)
    | st.integers(min_value=10**30, max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
RAW = st.dictionaries(st.text(max_size=12), JSON_VALUES, max_size=6)
TIMES = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
) | st.datetimes(timezones=st.timezones() | st.just(UTC)).filter(
    lambda moment: datetime(1, 1, 2, tzinfo=UTC) < moment < datetime(9999, 12, 30, tzinfo=UTC)
)
OPTIONAL_TEXT = st.none() | st.text()

EVENTS = st.builds(
    FileEvent,
    id=st.text(),
    type=st.sampled_from(["created", "deleted"]),
    key=st.text(),
    bucket=OPTIONAL_TEXT,
    size=st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.integers(),
    etag=OPTIONAL_TEXT,
    version_id=OPTIONAL_TEXT,
    time=st.none() | TIMES,
    sequencer=OPTIONAL_TEXT,
    provider=st.text(),
    version_only=st.none() | st.booleans(),
    raw=st.none() | RAW,
)


@settings(max_examples=400, deadline=None)
@given(EVENTS)
def test_events_as_written_read_as_before(event: FileEvent) -> None:
    """Read (or, for an integer beyond 64 bits, which orjson reads as a float, refused) as
    before, whatever the field values."""
    _same(event.model_dump_json().encode())


@settings(max_examples=200, deadline=None)
@given(
    id=st.text(),
    key=st.text(),
    size=st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1),
    time=st.none() | TIMES,
    raw=st.none()
    | st.dictionaries(
        st.text(max_size=8),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(min_value=-(2**63), max_value=2**63 - 1)
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=4), inner, max_size=3)
            ),
            max_leaves=10,
        ),
        max_size=5,
    ),
)
def test_events_as_written_take_the_fast_path(
    id: str, key: str, size: int | None, time: datetime | None, raw: dict[str, Any] | None
) -> None:
    """Not vacuous: every event the stream writes with 64-bit integers and `raw` no deeper
    than FAST_RAW_LEVELS (all of the providers') is read by msgspec, as the validated path
    reads it."""
    value = (
        FileEvent(id=id, type="deleted", key=key, size=size, time=time, provider="s3", raw=raw)
        .model_dump_json()
        .encode()
    )
    fast = _decode_event_fast(value)
    assert fast is not None
    assert _outcome(lambda _: fast, value) == _outcome(_decode_event_validated, value)


# -- mutations of them ----------------------------------------------------------------

FIELDS = list(FileEvent.model_fields)
WRONG_LIST: list[Any] = [
    "123", "1.0", "true", "1", "yes", "on", "", " 1", "1e3", "-0", "created ", "Created",
    "deleted", "null", 1.0, -0.0, 1e3, 1.5, 0, 1, True, False, [], {}, ["created"],
    2**63, 2**64, -(2**63) - 1, 10**30, 1_700_000_000, 1_700_000_000.5, "1700000000",
    "\ud800", "\udfff", "a\x00b", "\\u0000",
]  # fmt: skip
"""Values pydantic's lax mode may convert, or msgspec and orjson may read differently."""
WRONG_VALUES = (
    JSON_VALUES
    | st.sampled_from(WRONG_LIST)
    | st.from_regex(
        r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt _][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?"
        r"([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)?\Z"
    )
)
TIME_TEXT_LIST = [
    "2026-12-01T00:00:00Z", "2026-12-01T00:00:00.000000Z", "2026-12-01T00:00:00.000001Z",
    "2026-12-01T00:00:00.5Z", "2026-12-01T00:00:00.0000005Z", "2026-12-01T00:00:00.1234567Z",
    "2026-12-01t00:00:00z", "2026-12-01 00:00:00Z", "2026-12-01_00:00:00Z",
    "2026-12-01T00:00:00+00:00", "2026-12-01T00:00:00-00:00", "2026-12-01T01:00:00+01:00",
    "2026-12-01T00:00:00+0100", "2026-12-01T00:00:00+01", "2026-12-01T00:00:00",
    "2026-12-01T00:00Z", "2026-12-01", "2026-12-01T24:00:00Z", "2026-12-31T23:59:60Z",
    "2024-02-29T00:00:00Z", "2026-02-29T00:00:00Z", "0000-01-01T00:00:00Z",
    "0001-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59.999999Z",
    "9999-12-31T23:59:59-01:00", "2026-W48-1T00:00:00Z", "20261201T000000Z",
    "2026-12-01T00:00:00,000001Z", "2026-12-01T00:00:00.000001Z\n", " 2026-12-01T00:00:00Z",
    "\u0662\u0660\u0662\u0666-12-01T00:00:00Z", "1700000000",
    "2026-12-01T00:00:00.\uff11\uff12\uff13\uff14\uff15\uff16Z",
]  # fmt: skip
TIME_TEXTS = st.sampled_from(TIME_TEXT_LIST)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A written event with one or more of: a field removed, a field of another value or
    type, an extra field, a duplicated name, `raw` nested around MAX_DEPTH, text with
    escapes and surrogates; as JSON text in ASCII or in UTF-8."""
    document: dict[str, Any] = json.loads(draw(EVENTS).model_dump_json())
    pairs: list[tuple[str, Any]] = list(document.items())
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        kind = draw(
            st.sampled_from(["remove", "replace", "time", "extra", "duplicate", "deep", "raw"])
        )
        if kind == "remove" and pairs:
            pairs.pop(draw(st.integers(min_value=0, max_value=len(pairs) - 1)))
        elif kind == "replace":
            name = draw(st.sampled_from(FIELDS))
            pairs = [(key, draw(WRONG_VALUES)) if key == name else (key, v) for key, v in pairs]
        elif kind == "time":
            text = draw(TIME_TEXTS | WRONG_VALUES.filter(lambda v: isinstance(v, str)))
            pairs = [(key, text) if key == "time" else (key, v) for key, v in pairs]
        elif kind == "extra":
            name = draw(st.text(max_size=6) | st.sampled_from(["\ud800", "Id", "raw ", "x"]))
            pairs.append((name, draw(WRONG_VALUES | st.just(_nested(MAX_DEPTH)))))
        elif kind == "duplicate":
            name = draw(st.sampled_from(FIELDS))
            pairs.insert(draw(st.integers(0, len(pairs))), (name, draw(WRONG_VALUES)))
        elif kind == "deep":
            depth = draw(
                st.sampled_from([FAST_RAW_LEVELS, FAST_RAW_LEVELS + 1, FAST_RAW_LEVELS + 2])
                | st.integers(min_value=MAX_DEPTH - 3, max_value=MAX_DEPTH + 2)
            )
            inner = _nested(depth - 2)  # the event is level 1, `raw` level 2
            pairs = [(key, {"k": inner}) if key == "raw" else (key, v) for key, v in pairs]
        else:
            raw = draw(st.dictionaries(st.text(max_size=4) | st.just("\udfff"), WRONG_VALUES))
            pairs = [(key, raw) if key == "raw" else (key, v) for key, v in pairs]
    ascii_only = draw(st.booleans())
    body = ",".join(
        f"{_text(key, ascii_only).decode('utf-8', 'surrogatepass')}:"
        f"{_text(field, ascii_only).decode('utf-8', 'surrogatepass')}"
        for key, field in pairs
    )
    return ("{" + body + "}").encode("utf-8", "surrogatepass")


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_events_read_or_refused_as_before(value: bytes) -> None:
    _same(value)


# -- arbitrary JSON and bytes -----------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.booleans())
def test_any_json_read_or_refused_as_before(document: Any, ascii_only: bool) -> None:
    _same(_text(document, ascii_only))


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=64)
    | st.text(max_size=32).map(lambda text: text.encode("utf-8", "surrogatepass"))
)
def test_any_bytes_read_or_refused_as_before(value: bytes) -> None:
    _same(value)


# -- hostile values, each named ---------------------------------------------------------


def _replaced(value: bytes, old: bytes, new: bytes) -> bytes:
    assert old in value
    return value.replace(old, new, 1)


WRITTEN = _written()
HOSTILE: list[bytes | None] = [
    None,
    b"",
    b"null",
    b"[]",
    b'"event"',
    b"\xef\xbb\xbf" + WRITTEN,  # a UTF-8 BOM
    WRITTEN + b" x",
    WRITTEN + b"\n",
    WRITTEN[:-1],  # truncated
    _replaced(WRITTEN, b'"id":"s3:uploads/a.jpg:1",', b'"id":"a","id":"b",'),  # duplicate
    _replaced(WRITTEN, b'"id":"s3:uploads/a.jpg:1",', b'"id":1,"id":"b",'),
    _replaced(WRITTEN, b'"id":"s3:uploads/a.jpg:1",', b'"id":"a","id":1,'),
    _replaced(WRITTEN, b'"eventName"', b'"eventName":1,"eventName"'),  # duplicate in raw
    _replaced(WRITTEN, b'"id"', b'"\\u0069d"'),  # an escaped name
    _replaced(WRITTEN, b'"id"', b'"extra":"\\ud800","id"'),  # a surrogate in an unknown field
    _replaced(WRITTEN, b'"id"', b'"extra":"\xed\xa0\x80","id"'),
    _replaced(WRITTEN, b'"id"', b'"extra":"\xff","id"'),  # invalid UTF-8 in an unknown field
    _replaced(WRITTEN, b'"id"', b'"extra":NaN,"id"'),
    _replaced(WRITTEN, b'"id"', b'"extra":1e400,"id"'),
    _replaced(WRITTEN, b'"id"', b'"extra":' + b"1" * 5000 + b',"id"'),
    _replaced(WRITTEN, b'"id"', b'"extra":' + _nested_text(MAX_DEPTH) + b',"id"'),
    _replaced(WRITTEN, b'"eventName"', b'"\\udfff":1,"eventName"'),  # a surrogate name in raw
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b'"\\ud83d\\ude00"'),  # a pair: valid
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b'"\\ud83d"'),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b'"\\ude00\\ud83d"'),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b'"a\x01b"'),  # a control character
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b'"a\x7fb"'),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"-0.0"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"-0"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"1E2"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"1.7976931348623157e308"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"1.7976931348623159e308"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"2.2250738585072011e-308"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"4.9e-324"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"1e-400"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"0.1000000000000000055511151231257827"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"9223372036854775807"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"9223372036854775808"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"18446744073709551615"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"18446744073709551616"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"-9223372036854775808"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"-9223372036854775809"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"1" * 400),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"01"),
    _replaced(WRITTEN, b'"ObjectCreated:Put"', b"Infinity"),
    _replaced(WRITTEN, b'"size":1000', b'"size":9223372036854775808'),
    _replaced(WRITTEN, b'"size":1000', b'"size":18446744073709551616'),
    _replaced(WRITTEN, b'"size":1000', b'"size":123456789012345678901234567890'),
    _replaced(WRITTEN, b'"size":1000', b'"size":1000.0'),
    _replaced(WRITTEN, b'"size":1000', b'"size":1e3'),
    _replaced(WRITTEN, b'"size":1000', b'"size":"1000"'),
    _replaced(WRITTEN, b'"size":1000', b'"size":true'),
    _replaced(WRITTEN, b'"version_only":null', b'"version_only":1'),
    _replaced(WRITTEN, b'"version_only":null', b'"version_only":"true"'),
    _replaced(WRITTEN, b'"time":"2026-12-01T00:00:00.001000Z"', b'"time":1700000000'),
    _replaced(WRITTEN, b'"time":"2026-12-01T00:00:00.001000Z"', b'"time":1700000000.5'),
    _replaced(WRITTEN, b'"time":"2026-12-01T00:00:00.001000Z"', b'"time":"1700000000"'),
    _replaced(WRITTEN, b'"type":"created"', b'"type":"Created"'),
    _replaced(WRITTEN, b'"raw":{', b'"raw":[{'),
    *[
        _replaced(WRITTEN, b'"time":"2026-12-01T00:00:00.001000Z"', f'"time":"{text}"'.encode())
        for text in TIME_TEXT_LIST
        if "\n" not in text
    ],
    *[
        _written(raw={"k": _nested(depth - 2)})  # the event is level 1, `raw` level 2
        for depth in (FAST_RAW_LEVELS + 1, FAST_RAW_LEVELS + 2, FAST_RAW_LEVELS + 3)
    ],
    *[
        _replaced(
            _written(raw={}),
            b'"raw":{}',
            b'"raw":{"k":' + _nested_text(d - 2) + b"}",
        )
        for d in (MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, MAX_DEPTH + 2, 1025, 1026, 5000)
    ],
]


@pytest.mark.parametrize("value", HOSTILE, ids=lambda value: repr(value)[:80])
def test_hostile_values_read_or_refused_as_before(value: bytes | None) -> None:
    _same(value)


def test_the_depth_limit_is_kept_exactly() -> None:
    """MAX_DEPTH levels are read; one more is refused, with the validated path's reason."""

    def at(depth: int) -> bytes:
        return _replaced(
            _written(raw={}),
            b'"raw":{}',
            b'"raw":{"k":' + _nested_text(depth - 2) + b"}",
        )

    assert decode_event(at(MAX_DEPTH)).raw is not None
    with pytest.raises(EventDecodeError, match=f"nested deeper than {MAX_DEPTH} levels"):
        decode_event(at(MAX_DEPTH + 1))


def test_the_fast_path_vouches_for_the_time_it_reads() -> None:
    """`time` as the stream writes it is read by msgspec, in `timezone.utc` (what
    FileEvent.from_checked requires); written otherwise, it is pydantic's to read."""
    for moment in (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2026, 12, 1, 0, 0, 0, 1, tzinfo=UTC),
        datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 12, 1, 1, tzinfo=timezone(timedelta(hours=1))),
    ):
        event = _decode_event_fast(_written(time=moment))
        assert event is not None and event.time == moment and event.time.tzinfo is UTC
    plus = _replaced(WRITTEN, b"00.001000Z", b"00.001000+00:00")
    assert _decode_event_fast(plus) is None
    assert decode_event(plus) == _decode_event_validated(plus)
