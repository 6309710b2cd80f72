"""streams.core.routing.route: raw record -> keyed records per instance, filter counts, dead
letters."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from streams.config import Settings
from streams.core.event import FileEvent
from streams.core.records import OutRecord, RawRecord, parse_keyed
from streams.core.routing import route

SETTINGS = Settings.model_validate(
    {
        "stream": {
            "raw_topics": ["files.raw", {"name": "minio.events", "default_source": "minio"}],
        },
        "instances": [
            {
                "name": "tenant-a",
                "bucket": "uploads",
                "prefix": "tenant-a",
                "plugins": ["versioning"],
            },
            {"name": "all", "bucket": "*"},
        ],
    }
)
REPARTITION = SETTINGS.stream.repartition_topic
DEAD_LETTER = SETTINGS.stream.dead_letter_topic


def s3_record(key: str, bucket: str = "uploads", sequencer: str = "0055AED6DCD90281E5") -> Any:
    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventTime": "2026-11-30T00:08:07.000Z",
        "eventName": "ObjectCreated:Put",
        "s3": {
            "s3SchemaVersion": "1.0",
            "bucket": {"name": bucket},
            "object": {"key": key, "size": 1024, "eTag": "abc", "sequencer": sequencer},
        },
    }


def s3_body(*records: Any) -> bytes:
    return json.dumps({"Records": list(records)}).encode()


def raw(
    body: bytes, topic: str = "files.raw", more: dict[str, bytes] | None = None, **headers: bytes
) -> RawRecord:
    """A raw record; keyword headers have `_` for `-` (received_at -> received-at)."""
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    return RawRecord(topic, body, named | (more or {}))


def keyed(records: list[OutRecord]) -> list[tuple[bytes | None, str, str]]:
    """(repartition key, instance, event key) of every keyed record."""
    found = []
    for record in records:
        assert record.topic == REPARTITION
        assert record.value is not None
        event = parse_keyed(record.value, dict(record.headers))
        found.append((record.key, event.instance, event.key))
    return found


def test_events_fan_out_per_instance_with_the_repartition_key() -> None:
    record = raw(s3_body(s3_record("tenant-a/photos/red+flower.jpg")), source=b"s3")
    routed = route(record, b"any", SETTINGS)
    assert keyed(routed.records) == [
        (b"tenant-a/uploads/photos/red flower.jpg", "tenant-a", "photos/red flower.jpg"),
        (b"all/uploads/tenant-a/photos/red flower.jpg", "all", "tenant-a/photos/red flower.jpg"),
    ]
    assert routed.events == 1
    assert routed.filtered == Counter()
    assert routed.dead_letter_reason is None


def test_keyed_value_carries_the_whole_event() -> None:
    routed = route(raw(s3_body(s3_record("x")), source=b"s3"), None, SETTINGS)
    record = routed.records[0]
    assert record.value is not None
    event = FileEvent.model_validate_json(record.value)
    assert dict(record.headers)["instance"] == b"all"
    assert (event.bucket, event.size, event.etag, event.provider) == ("uploads", 1024, "abc", "s3")
    assert event.sequencer == "0055AED6DCD90281E5"


def test_received_at_travels_with_every_keyed_record() -> None:
    record = raw(s3_body(s3_record("tenant-a/x")), source=b"s3", received_at=b"1764461287000")
    routed = route(record, None, SETTINGS)
    assert len(routed.records) == 2
    assert all(dict(r.headers)["received-at"] == b"1764461287000" for r in routed.records)


def test_without_received_at_only_the_instance_header() -> None:
    routed = route(raw(s3_body(s3_record("x")), source=b"s3"), None, SETTINGS)
    assert [r.headers for r in routed.records] == [(("instance", b"all"),)]


def test_filtered_counts_by_instance_and_reason() -> None:
    body = s3_body(
        s3_record("tenant-a/kept"),
        s3_record("tenant-a/x", bucket="other"),
        s3_record("tenant-b/x"),
        s3_record("tenant-a-archive/x"),
        s3_record("tenant-a/.versions/x/1"),
    )
    routed = route(raw(body, source=b"s3"), None, SETTINGS)
    assert routed.events == 5
    assert routed.filtered == Counter(
        {("tenant-a", "prefix"): 2, ("tenant-a", "bucket"): 1, ("tenant-a", "plugin:versioning"): 1}
    )
    assert [(instance, key) for _, instance, key in keyed(routed.records)] == [
        ("tenant-a", "kept"),
        ("all", "tenant-a/kept"),
        ("all", "tenant-a/x"),
        ("all", "tenant-b/x"),
        ("all", "tenant-a-archive/x"),
        ("all", "tenant-a/.versions/x/1"),
    ]


def test_a_delivery_without_file_events_routes_nothing() -> None:
    body = json.dumps(
        {
            "Service": "Amazon S3",
            "Event": "s3:TestEvent",
            "Time": "2026-11-30T00:08:07.000Z",
            "Bucket": "uploads",
            "RequestId": "r",
            "HostId": "h",
        }
    ).encode()
    routed = route(raw(body, source=b"s3"), None, SETTINGS)
    assert (routed.records, routed.events, routed.filtered) == ([], 0, Counter())
    assert routed.dead_letter_reason is None


def assert_dead_letter(
    record: RawRecord, key: bytes | None, reason_part: str, reason_start: str
) -> None:
    routed = route(record, key, SETTINGS)
    assert len(routed.records) == 1
    dead = routed.records[0]
    assert dead.topic == DEAD_LETTER
    assert (dead.key, dead.value) == (key, record.value)
    headers = dict(dead.headers)
    assert len(headers) == len(dead.headers)
    for name, value in record.headers.items():
        assert headers[name] == value
    assert headers["error.stage"] == b"normalize"
    assert headers["error.topic"] == record.topic.encode()
    error = headers["error"].decode()
    assert error == routed.dead_letter_reason
    assert error.startswith(reason_start)
    assert reason_part in error
    assert routed.events == 0
    assert routed.filtered == Counter()


@pytest.mark.parametrize("body", [b"not json", b"", b"\xff", b'{"Records": 3}', b"[]"])
def test_a_malformed_body_is_one_dead_letter(body: bytes) -> None:
    more = {"header.content-type": b"text/plain", "attribute.x": b"\xff"}
    record = raw(body, more=more, source=b"s3", received_at=b"1")
    assert_dead_letter(record, b"k", "", "s3: ")


def test_a_missing_source_is_one_dead_letter() -> None:
    record = raw(s3_body(s3_record("x")), transport=b"sqs")
    assert_dead_letter(record, None, "no `source` header", "?: ")


def test_an_empty_source_header_without_a_default_is_a_dead_letter() -> None:
    assert_dead_letter(raw(s3_body(s3_record("x")), source=b""), None, "no `source`", "?: ")


def test_an_unknown_source_is_one_dead_letter() -> None:
    record = raw(s3_body(s3_record("x")), source=b"dropbox")
    assert_dead_letter(record, b"k", "unknown source 'dropbox'", "dropbox: ")


def test_a_topic_not_in_the_config_has_no_default_source() -> None:
    record = raw(s3_body(s3_record("x")), topic="elsewhere")
    assert_dead_letter(record, None, "no `source` header", "?: ")


MINIO_BODY = json.dumps(
    {
        "EventName": "s3:ObjectCreated:Put",
        "Key": "images/tenant-a/a+b.jpg",
        "Records": [
            {
                "eventVersion": "2.0",
                "eventSource": "minio:s3",
                "eventTime": "2019-09-10T17:41:54Z",
                "eventName": "s3:ObjectCreated:Put",
                "s3": {
                    "bucket": {"name": "images"},
                    "object": {"key": "tenant-a%2Fa%2Bb.jpg", "size": 6474, "sequencer": "15C3"},
                },
            }
        ],
    }
).encode()


def test_default_source_applies_without_a_source_header() -> None:
    routed = route(raw(MINIO_BODY, topic="minio.events"), None, SETTINGS)
    # bucket "images" is not tenant-a's: only the all-buckets instance keeps it.
    assert keyed(routed.records) == [(b"all/images/tenant-a/a+b.jpg", "all", "tenant-a/a+b.jpg")]
    assert routed.filtered == Counter({("tenant-a", "bucket"): 1})
    value = routed.records[0].value
    assert value is not None
    assert FileEvent.model_validate_json(value).provider == "minio"


def test_the_source_header_wins_over_the_default() -> None:
    record = raw(s3_body(s3_record("x")), topic="minio.events", source=b"s3")
    routed = route(record, None, SETTINGS)
    value = routed.records[0].value
    assert value is not None
    assert FileEvent.model_validate_json(value).provider == "s3"


def test_a_malformed_delivery_on_a_default_source_topic_names_that_source() -> None:
    assert_dead_letter(raw(b"{", topic="minio.events"), None, "", "minio: ")
