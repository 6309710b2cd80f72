"""The pure size accounting that keeps one delivery from stopping the stream (issue 13, item 2):
record sizes as Kafka counts them, the topic limits, the field bounds every normalizer's
events are held to, stage one's refusal of an event too large for its topics, and what
replaces a record Kafka refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from streams.config import Settings
from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers import KEY_LIMITS, SOURCES, MalformedDelivery, check_bounds, normalize
from streams.core.records import (
    OutRecord,
    RawRecord,
    dead_letter_record,
    event_record_bytes,
    keyed_record,
    out_record_bytes,
    output_record,
    record_bytes,
    stale_record,
)
from streams.core.routing import route
from streams.engine.outcomes import VALUE_DROPPED_HEADER, DeadLetters
from streams.engine.topics import (
    DEAD_LETTER_MAX_MESSAGE_BYTES,
    EVENT_MAX_MESSAGE_BYTES,
    MAX_MESSAGE_BYTES,
    RAW_MAX_MESSAGE_BYTES,
    topology,
)
from streams.stages.normalize import route_policy

SETTINGS = Settings.model_validate({"instances": [{"name": "tenant-a", "prefix": "tenant-a"}]})


def batch_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    """What aiokafka's producer actually puts on the wire for one record alone."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=1,
        producer_id=123456789,
        producer_epoch=7,
        base_sequence=99,
        batch_size=64 * 1024 * 1024,
    )
    builder.append(0, timestamp=1_796_000_000_000, key=key, value=value, headers=headers)
    return len(builder.build())


@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (None, None, []),
        (b"k", b"v", []),
        (b"k" * 300, b"v" * 70_000, [("h" * 200, b"x" * 20_000), ("ce_id", b"s3:" + b"a" * 32)]),
        (b"", b"x" * 2_000_000, [(f"header.{n}", b"y" * 8192) for n in range(120)]),
    ],
)
def test_record_bytes_is_an_upper_bound_of_the_batch_kafka_checks(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
) -> None:
    actual = batch_size(key, value, headers)
    counted = record_bytes(key, value, headers)
    assert actual <= counted <= actual + 40 + 10 * len(headers)


def event(key: str, raw_padding: int = 0, **fields: Any) -> FileEvent:
    values: dict[str, Any] = {
        "id": "s3:" + "a" * 32,
        "type": "created",
        "key": key,
        "bucket": "uploads",
        "time": datetime(2026, 11, 30, tzinfo=UTC),
        "sequencer": "0055AED6DCD90281E5",
        "provider": "s3",
        "raw": {"pad": "p" * raw_padding},
    }
    return FileEvent(**(values | fields))


def test_event_record_bytes_bounds_the_keyed_output_and_stale_records() -> None:
    kept = event("photos/" + "é" * 300, raw_padding=5_000)
    keyed = keyed_record("by-key", "tenant-a", kept, b"1796000000.5")
    bound = event_record_bytes("tenant-a", kept, keyed)
    reason = (
        "s3-sequencer "
        + "F" * 1024
        + " is older than that of the emitted created event "
        + ("b" * 1024)
    )
    for record in (
        keyed,
        output_record("out", "tenant-a", kept),
        stale_record("stale", "tenant-a", kept, reason),
    ):
        assert batch_size(record.key, record.value, list(record.headers)) <= bound


def test_the_limits_come_from_one_table_and_every_topic_sets_its_own() -> None:
    specs = topology(SETTINGS)
    assert {spec.role for spec in specs} == set(MAX_MESSAGE_BYTES)
    for spec in specs:
        assert int(spec.config["max.message.bytes"]) == MAX_MESSAGE_BYTES[spec.role], spec
    # A dead letter carries a whole raw delivery plus the error headers.
    raw = RawRecord("files.raw", b"x" * (RAW_MAX_MESSAGE_BYTES - 200_000), {"source": b"s3"})
    letter = dead_letter_record("dl", raw, b"k" * 1000, "e" * 10_000, "normalize")
    assert out_record_bytes(letter) - len(raw.value) < DEAD_LETTER_MAX_MESSAGE_BYTES - (
        RAW_MAX_MESSAGE_BYTES
    )
    assert EVENT_MAX_MESSAGE_BYTES < RAW_MAX_MESSAGE_BYTES < DEAD_LETTER_MAX_MESSAGE_BYTES


def test_every_source_has_a_key_limit() -> None:
    assert set(KEY_LIMITS) == set(SOURCES)


@pytest.mark.parametrize(
    ("source", "longest"),
    [
        ("s3", "k" * 1024),
        ("s3", "é" * 512),  # 1,024 bytes of UTF-8
        ("gcs", "g" * 1024),
        ("azure", "é" * 1024),  # 1,024 characters, 2,048 bytes
        ("appwrite", "a" * 36),
    ],
)
def test_a_key_at_its_providers_limit_passes_and_one_longer_is_malformed(
    source: str, longest: str
) -> None:
    limit = KEY_LIMITS[source]
    check_bounds(event(longest), limit)
    with pytest.raises(MalformedDelivery, match="longer than the provider allows"):
        check_bounds(event(longest + longest[-1]), limit)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("bucket", "b" * 256, "bucket name of 256 bytes"),
        ("id", "s3:" + "i" * 1022, "event id of 1,025 bytes"),
        ("sequencer", "F" * 1025, "sequencer of 1,025 bytes"),
        ("etag", "e" * 2000, "ETag of 2,000 bytes"),
        ("version_id", "v" * 1025, "version id of 1,025 bytes"),
    ],
)
def test_fields_longer_than_any_provider_writes_are_malformed(
    field: str, value: str, message: str
) -> None:
    with pytest.raises(MalformedDelivery, match=message):
        check_bounds(event("k", **{field: value}), KEY_LIMITS["s3"])


def minio_delivery(key: str) -> bytes:
    record = {
        "eventVersion": "2.0",
        "eventSource": "minio:s3",
        "eventTime": "2026-11-30T00:08:07.000Z",
        "eventName": "s3:ObjectCreated:Put",
        "s3": {
            "bucket": {"name": "uploads"},
            "object": {"key": key, "size": 1, "sequencer": "17A0000000000001"},
        },
    }
    return json.dumps({"EventName": "s3:ObjectCreated:Put", "Records": [record]}).encode()


def test_every_source_is_checked_by_normalize_itself() -> None:
    with pytest.raises(MalformedDelivery, match="object key of 400,000 bytes"):
        normalize(Delivery("minio", minio_delivery("k" * 400_000)))
    assert [e.key for e in normalize(Delivery("minio", minio_delivery("k" * 1024)))] == ["k" * 1024]


def s3_delivery(key: str, padding: int) -> bytes:
    record = {
        "eventSource": "aws:s3",
        "eventTime": "2026-11-30T00:08:07.000Z",
        "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": "uploads"}, "object": {"key": key, "sequencer": "00A1"}},
        "padding": "p" * padding,
    }
    return json.dumps({"Records": [record]}).encode()


def test_an_event_too_large_for_its_topics_dead_letters_its_whole_delivery() -> None:
    body = s3_delivery("tenant-a/big", EVENT_MAX_MESSAGE_BYTES)
    record = RawRecord("files.raw", body, {"source": b"s3"})
    routed = route(record, b"raw-key", route_policy(SETTINGS))
    [letter] = routed.records
    assert letter.topic == SETTINGS.stream.dead_letter_topic
    assert letter.value == body and letter.key == b"raw-key"
    reason = dict(letter.headers)["error"].decode()
    assert routed.dead_letter_reason == reason
    assert f"over the {EVENT_MAX_MESSAGE_BYTES:,}-byte limit" in reason
    assert "for instance tenant-a makes a record of 1,0" in reason


def test_an_event_just_within_the_limit_is_routed() -> None:
    body = s3_delivery("tenant-a/big", EVENT_MAX_MESSAGE_BYTES - 10_000)
    routed = route(RawRecord("files.raw", body, {"source": b"s3"}), None, route_policy(SETTINGS))
    assert routed.dead_letter_reason is None
    [keyed] = routed.records
    assert keyed.topic == SETTINGS.stream.repartition_topic
    assert out_record_bytes(keyed) <= EVENT_MAX_MESSAGE_BYTES


def test_a_refused_record_becomes_a_dead_letter_then_one_without_value_then_nothing() -> None:
    letters = DeadLetters("dl", "emit")
    output = OutRecord("out", b"k", b"v" * 5000, (("ce_id", b"id-1"),))
    first = letters(output, "refused: too large")
    assert first is not None and first.topic == "dl" and first.value == output.value
    headers = dict(first.headers)
    assert headers["error.topic"] == b"out" and headers["ce_id"] == b"id-1"
    second = letters(first, "dead letter refused")
    assert second is not None and second.value is None and second.key == b"k"
    kept = dict(second.headers)
    assert kept[VALUE_DROPPED_HEADER] == b"5000" and kept["ce_id"] == b"id-1"
    assert kept["error"].startswith(b"refused: too large") and b"value dropped" in kept["error"]
    assert len(kept["error"]) <= 4096
    assert letters(second, "refused again") is None
