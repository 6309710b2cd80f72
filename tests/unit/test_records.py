"""streams.records: raw record -> Delivery, and the keyed / dead-letter record shapes."""

from __future__ import annotations

import json

import pytest

from streams.event import FileEvent
from streams.records import (
    RawRecord,
    dead_letter_record,
    delivery_from_raw,
    headers_dict,
    keyed_record,
    parse_keyed_value,
    partition_key,
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
    assert record.headers == (("received-at", b"17"),)
    assert record.value is not None
    assert json.loads(record.value)["instance"] == "tenant-a"
    assert parse_keyed_value(record.value) == ("tenant-a", event)


@pytest.mark.parametrize("value", [b"null", b"[]", b'{"instance": null}', b"x"])
def test_parse_keyed_value_raises_value_error(value: bytes) -> None:
    with pytest.raises(ValueError):
        parse_keyed_value(value)


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
