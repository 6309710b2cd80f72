"""streams.core.records: raw record -> Delivery, and the keyed / dead-letter record shapes."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.event import FileEvent
from streams.core.records import (
    RawRecord,
    dead_letter_record,
    delivery_from_raw,
    event_json,
    headers_dict,
    keyed_output_record,
    keyed_record,
    keyed_stale_record,
    output_record,
    parse_keyed,
    partition_key,
    stale_record,
)


def test_delivery_from_raw_sorts_headers_and_attributes() -> None:
    record = RawRecord(
        "files.raw",
        b'{"exact": "bytes"}',
        {
            "source": b"gcs",
            "transport": b"pubsub-pull",
            "delivery-id": b"123",
            "received-at": b"1700000000000",
            "header.Content-Type": b"application/json",
            "header.X-Goog-Channel-ID": b"chan",
            "attribute.eventType": b"OBJECT_FINALIZE",
            "attribute.bucketId": b"uploads",
        },
    )
    delivery = delivery_from_raw(record, None)
    assert delivery.source == "gcs"
    assert delivery.body is record.value
    assert dict(delivery.headers) == {
        "content-type": "application/json",
        "x-goog-channel-id": "chan",
    }
    # Attribute names keep the provider's spelling.
    assert dict(delivery.attributes) == {"eventType": "OBJECT_FINALIZE", "bucketId": "uploads"}


@pytest.mark.parametrize(
    ("headers", "default", "expected"),
    [
        ({"source": b"s3"}, None, "s3"),
        ({"source": b"s3"}, "minio", "s3"),
        ({}, "minio", "minio"),
        ({"source": b""}, "minio", "minio"),
        ({}, None, ""),
    ],
)
def test_source_header_wins_over_the_default(
    headers: dict[str, bytes], default: str | None, expected: str
) -> None:
    assert delivery_from_raw(RawRecord("t", b"", headers), default).source == expected


def test_undecodable_and_null_header_values_do_not_raise() -> None:
    record = RawRecord(
        "t",
        b"",
        {"header.X-Bad": b"\xff", "attribute.a": None},  # type: ignore[dict-item]
    )
    delivery = delivery_from_raw(record, "s3")
    assert dict(delivery.headers) == {"x-bad": "\ufffd"}
    assert dict(delivery.attributes) == {"a": ""}


def test_keyed_record_round_trip() -> None:
    event = FileEvent(id="x:1", type="created", key="a b/\u00e9.txt", provider="s3", raw={"n": 1})
    record = keyed_record("by-key", "tenant-a", event, b"17")
    assert (record.topic, record.key) == (
        "by-key",
        "tenant-a//a b/\u00e9.txt".encode(),
    )  # no bucket
    assert record.key == partition_key("tenant-a", event.bucket, event.key)
    assert record.headers[:2] == (("instance", b"tenant-a"), ("received-at", b"17"))
    assert [name for name, _ in record.headers[2:]] == ["head"]  # streams.core.keyedhead
    # The value is the output's bytes already: stage two passes it through.
    assert record.value == output_record("out", "tenant-a", event).value
    keyed = parse_keyed(record.value, dict(record.headers))
    assert (keyed.instance, keyed.id, keyed.type, keyed.key, keyed.provider) == (
        "tenant-a",
        "x:1",
        "created",
        "a b/\u00e9.txt",
        "s3",
    )
    assert keyed.raw == {}  # the head carries only the raw fields ordering reads
    assert keyed.value is record.value


def test_keyed_output_headers_match_those_of_the_event() -> None:
    event = FileEvent(
        id="x:1",
        type="deleted",
        key="k",
        provider="gcs",
        time=datetime(2026, 11, 30, 1, 2, 3, 450000, tzinfo=UTC),
    )
    record = keyed_record("by-key", "a", event, None)
    assert record.value is not None
    keyed = parse_keyed(record.value, dict(record.headers))
    assert keyed.time == event.time
    assert keyed_output_record("out", keyed) == output_record("out", "a", event)
    assert keyed_stale_record("late", keyed, "older") == stale_record("late", "a", event, "older")


def test_the_first_keyed_format_is_still_read() -> None:
    event = FileEvent(id="x:1", type="created", key="k", provider="s3", size=3)
    value = json.dumps({"instance": "a", "event": event.model_dump(mode="json")}).encode()
    keyed = parse_keyed(value, {"received-at": b"17"})
    assert (keyed.instance, keyed.id, keyed.key) == ("a", "x:1", "k")
    assert keyed.value == output_record("out", "a", event).value


@pytest.mark.parametrize(
    ("value", "headers"),
    [
        (b"null", {}),
        (b"[]", {}),
        (b'{"instance": null}', {}),
        (b"x", {}),
        (b"[]", {"instance": b"a"}),
        (b'{"id": "1", "key": "k", "provider": "s3"}', {"instance": b"a"}),
        (b'{"id": "1", "type": "moved", "key": "k", "provider": "s3"}', {"instance": b"a"}),
        (b'{"id": 1, "type": "created", "key": "k", "provider": "s3"}', {"instance": b"a"}),
        (
            b'{"id": "1", "type": "created", "key": "k", "provider": "s3", "time": "2026-11-30"}',
            {"instance": b"a"},
        ),
        (
            b'{"id": "1", "type": "created", "key": "k", "provider": "s3", "time": "yesterday"}',
            {"instance": b"a"},
        ),
    ],
)
def test_parse_keyed_raises_value_error(value: bytes, headers: dict[str, bytes]) -> None:
    with pytest.raises(ValueError):
        parse_keyed(value, headers)


def test_dead_letter_record_keeps_bytes_and_headers_and_bounds_the_error() -> None:
    record = RawRecord("files.raw", b"\x00body", {"source": b"s3", "n": None})  # type: ignore[dict-item]
    dead = dead_letter_record("dlq", record, b"key", "\u00e9" * 5000, "normalize")
    assert (dead.topic, dead.key, dead.value) == ("dlq", b"key", b"\x00body")
    headers = dict(dead.headers)
    assert set(headers) == {"source", "error", "error.stage", "error.topic"}
    assert len(headers["error"]) == 4096
    assert headers["error.stage"] == b"normalize"
    assert headers["error.topic"] == b"files.raw"


def test_headers_dict_last_value_wins() -> None:
    assert headers_dict([("a", b"1"), ("b", b"2"), ("a", b"3")]) == {"a": b"3", "b": b"2"}
    assert headers_dict(None) == {}
    assert headers_dict({"a": b"1"}) == {"a": b"1"}


_json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too: pydantic writes those
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_raw = st.dictionaries(
    st.text(),
    st.recursive(
        _json_leaves,
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=6), children, max_size=3)
        ),
        max_leaves=12,
    ),
    max_size=4,
)
_optional_text = st.none() | st.text()


@settings(max_examples=400, deadline=None, database=None)
@given(
    id=st.text(min_size=1),
    key=st.text(),
    bucket=_optional_text,
    size=st.none() | st.integers(min_value=0, max_value=2**63),
    etag=_optional_text,
    time=st.none() | st.datetimes(timezones=st.just(UTC)),
    sequencer=_optional_text,
    raw=st.none() | _raw,
)
def test_event_json_writes_what_pydantic_writes(
    id: str,
    key: str,
    bucket: str | None,
    size: int | None,
    etag: str | None,
    time: datetime | None,
    sequencer: str | None,
    raw: dict[str, object] | None,
) -> None:
    """The per-event writer (orjson, pydantic's writer where orjson refuses) gives the bytes
    `model_dump_json` gives, whatever the strings, numbers and nesting of the values."""
    event = FileEvent(
        id=id,
        type="created",
        key=key,
        bucket=bucket,
        size=size,
        etag=etag,
        time=time,
        sequencer=sequencer,
        provider="s3",
        raw=raw,
    )
    assert event_json(event) == event.model_dump_json().encode()
