"""streams.core.routing.route: raw record -> keyed records per instance, filter counts, dead
letters."""

from __future__ import annotations

import json
import logging
from collections import Counter
from functools import cache
from typing import Any

import pytest

from streams.config import Settings
from streams.core import routing
from streams.core.event import FileEvent
from streams.core.normalizers import SOURCES
from streams.core.records import OutRecord, RawRecord, parse_keyed
from streams.core.routing import route
from streams.stages.normalize import route_policy

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
    routed = route(record, b"any", route_policy(SETTINGS))
    assert keyed(routed.records) == [
        (b"tenant-a/uploads/photos/red flower.jpg", "tenant-a", "photos/red flower.jpg"),
        (b"all/uploads/tenant-a/photos/red flower.jpg", "all", "tenant-a/photos/red flower.jpg"),
    ]
    assert routed.events == 1
    assert routed.filtered == Counter()
    assert routed.dead_letter_reason is None


def test_keyed_value_carries_the_whole_event() -> None:
    routed = route(raw(s3_body(s3_record("x")), source=b"s3"), None, route_policy(SETTINGS))
    record = routed.records[0]
    assert record.value is not None
    event = FileEvent.model_validate_json(record.value)
    assert dict(record.headers)["instance"] == b"all"
    assert (event.bucket, event.size, event.etag, event.provider) == ("uploads", 1024, "abc", "s3")
    assert event.sequencer == "0055AED6DCD90281E5"


def test_received_at_travels_with_every_keyed_record() -> None:
    record = raw(s3_body(s3_record("tenant-a/x")), source=b"s3", received_at=b"1764461287000")
    routed = route(record, None, route_policy(SETTINGS))
    assert len(routed.records) == 2
    assert all(dict(r.headers)["received-at"] == b"1764461287000" for r in routed.records)


def test_without_received_at_only_the_instance_and_head_headers() -> None:
    routed = route(raw(s3_body(s3_record("x")), source=b"s3"), None, route_policy(SETTINGS))
    assert [[name for name, _ in r.headers] for r in routed.records] == [["instance", "head"]]
    assert routed.records[0].headers[0] == ("instance", b"all")


def test_filtered_counts_by_instance_and_reason() -> None:
    body = s3_body(
        s3_record("tenant-a/kept"),
        s3_record("tenant-a/x", bucket="other"),
        s3_record("tenant-b/x"),
        s3_record("tenant-a-archive/x"),
        s3_record("tenant-a/.versions/x/1"),
    )
    routed = route(raw(body, source=b"s3"), None, route_policy(SETTINGS))
    assert routed.events == 5
    # Only candidates count: an event outside tenant-a's bucket or prefix was never its.
    assert routed.filtered == Counter({("tenant-a", "plugin:versioning"): 1})
    assert [(instance, key) for _, instance, key in keyed(routed.records)] == [
        ("tenant-a", "kept"),
        ("all", "tenant-a/kept"),
        ("all", "tenant-a/x"),
        ("all", "tenant-b/x"),
        ("all", "tenant-a-archive/x"),
        ("all", "tenant-a/.versions/x/1"),
    ]


def test_an_event_no_instance_holds_counts_once_under_no_instance() -> None:
    """Issue 33: what no instance's bucket and prefix hold is counted once, not per instance."""
    settings = Settings.model_validate(
        {
            "instances": [
                {"name": f"tenant-{i}", "bucket": "uploads", "prefix": f"tenant-{i}"}
                for i in range(50)
            ]
        }
    )
    body = s3_body(s3_record("tenant-7/x"), s3_record("elsewhere/x"), s3_record("x", "other"))
    routed = route(raw(body, source=b"s3"), None, route_policy(settings))
    assert [(instance, key) for _, instance, key in keyed(routed.records)] == [("tenant-7", "x")]
    assert routed.filtered == Counter({routing.NO_INSTANCE: 2})
    assert routing.NO_INSTANCE == ("*", "no-instance")


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
    routed = route(raw(body, source=b"s3"), None, route_policy(SETTINGS))
    assert (routed.records, routed.events, routed.filtered) == ([], 0, Counter())
    assert routed.dead_letter_reason is None


def assert_dead_letter(
    record: RawRecord, key: bytes | None, reason_part: str, reason_start: str
) -> None:
    routed = route(record, key, route_policy(SETTINGS))
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


@pytest.mark.parametrize("separator", ["\n", "\r", "\r\n", "\u2028", "\x85", "\x1b[2K\r"])
def test_a_dead_letter_reason_quoting_input_is_one_printable_line(separator: str) -> None:
    """Issue 31, item 3: the normalize stage logs the reason, so the input it quotes must
    not end the line (a `source` header forging a line of the worker's log)."""
    forged = "[2026-12-07 03:00:00,000] [1] [CRITICAL] FORGED ok"
    record = raw(s3_body(s3_record("x")), source=f"s3{separator}{forged}".encode())
    routed = route(record, b"k", route_policy(SETTINGS))
    reason = routed.dead_letter_reason
    assert reason is not None and reason.isprintable(), reason
    assert reason.splitlines() == [reason]
    escaped = separator.encode("unicode_escape").decode()
    assert reason.startswith(f"s3{escaped}{forged}: unknown source"), reason
    [letter] = routed.records
    assert dict(letter.headers)["error"] == reason.encode()


def test_a_reason_without_unprintable_characters_is_kept_as_it_is() -> None:
    record = raw(s3_body(s3_record("x")), source="dröp\\box".encode())
    assert route(record, b"k", route_policy(SETTINGS)).dead_letter_reason == (
        "dröp\\box: unknown source 'dröp\\\\box' (known: " + ", ".join(SOURCES) + ")"
    )


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
    routed = route(raw(MINIO_BODY, topic="minio.events"), None, route_policy(SETTINGS))
    # bucket "images" is not tenant-a's: only the all-buckets instance keeps it.
    assert keyed(routed.records) == [(b"all/images/tenant-a/a+b.jpg", "all", "tenant-a/a+b.jpg")]
    assert routed.filtered == Counter()  # tenant-a, of another bucket, was never a candidate
    value = routed.records[0].value
    assert value is not None
    assert FileEvent.model_validate_json(value).provider == "minio"


def test_a_topic_with_a_default_source_refuses_a_record_claiming_another() -> None:
    """Issue 23 #1: MinIO's own Kafka target writes `minio.events`; a credential that may
    write it must not write as S3 (or reconcile) by setting a `source` header."""
    record = raw(s3_body(s3_record("x")), topic="minio.events", source=b"s3")
    assert_dead_letter(record, None, "raw topic minio.events carries minio only", "s3: ")
    reconcile = raw(reconcile_body("all", "deleted"), topic="minio.events", source=b"reconcile")
    assert_dead_letter(reconcile, None, "cannot claim source 'reconcile'", "reconcile: ")
    # Its own source, said or not, is normalized as before.
    said_minio = raw(MINIO_BODY, topic="minio.events", source=b"minio")
    said = route(said_minio, None, route_policy(SETTINGS))
    assert keyed(said.records) == [(b"all/images/tenant-a/a+b.jpg", "all", "tenant-a/a+b.jpg")]


def reconcile_body(instance: str | None, kind: str = "created", **more: Any) -> bytes:
    body: dict[str, Any] = {
        "type": kind,
        "bucket": "uploads",
        "key": "tenant-a/x.txt",
        "etag": "e1",
        "observed_at": "2026-11-30T01:00:00Z",
        **more,
    }
    if instance is not None:
        body["instance"] = instance
    return json.dumps(body).encode()


@cache
def scoped() -> Settings:
    """Raw topics that say what they carry and reach (a function: main refused the keys)."""
    return Settings.model_validate(
        {
            "stream": {
                "raw_topics": [
                    {"name": "files.raw", "sources": ["s3", "minio"]},
                    {"name": "minio.events", "default_source": "minio", "instances": ["tenant-a"]},
                    {"name": "reconcile.a", "sources": ["reconcile"], "instances": ["tenant-a"]},
                    {"name": "reconcile.any", "sources": ["reconcile"]},
                ],
            },
            "instances": [
                {"name": "tenant-a", "bucket": "uploads", "prefix": "tenant-a", "sources": ["s3"]},
                {"name": "tenant-b", "bucket": "uploads", "prefix": "tenant-a", "sources": ["s3"]},
            ],
        }
    )


def scoped_route(record: RawRecord) -> Any:
    return route(record, None, route_policy(scoped()))


def test_a_topic_carries_only_the_sources_the_configuration_gives_it() -> None:
    refused = scoped_route(raw(reconcile_body("tenant-a"), source=b"reconcile"))
    assert [r.topic for r in refused.records] == [scoped().stream.dead_letter_topic]
    assert refused.dead_letter_reason == (
        "reconcile: raw topic files.raw carries s3, minio only: a record on it cannot claim "
        "source 'reconcile'"
    )
    kept = scoped_route(raw(s3_body(s3_record("tenant-a/x")), source=b"s3"))
    assert keyed(kept.records) == [
        (b"tenant-a/uploads/x", "tenant-a", "x"),
        (b"tenant-b/uploads/x", "tenant-b", "x"),
    ]


def test_a_topic_with_instances_reaches_only_those() -> None:
    routed = scoped_route(raw(MINIO_BODY.replace(b"images", b"uploads"), topic="minio.events"))
    # tenant-a does not accept minio; tenant-b is not reached by the topic at all.
    assert routed.records == []
    assert routed.filtered == Counter({("tenant-a", "source"): 1, ("tenant-b", "topic"): 1})


def test_a_reconcile_delivery_reaches_only_the_instance_it_names() -> None:
    """Issue 23 #1: today a reconcile delivery passes every instance's `sources` filter."""
    routed = scoped_route(
        raw(reconcile_body("tenant-b"), topic="reconcile.any", source=b"reconcile")
    )
    assert keyed(routed.records) == [(b"tenant-b/uploads/x.txt", "tenant-b", "x.txt")]
    assert routed.filtered == Counter({("tenant-a", "instance"): 1})


def test_a_reconcile_topic_of_one_instance_refuses_another_s_deliveries() -> None:
    pinned = raw(reconcile_body("tenant-b"), topic="reconcile.a", source=b"reconcile")
    routed = scoped_route(pinned)
    assert [r.topic for r in routed.records] == [scoped().stream.dead_letter_topic]
    assert routed.dead_letter_reason == (
        "reconcile: raw topic reconcile.a reaches tenant-a only, not instance 'tenant-b'"
    )
    unnamed = scoped_route(raw(reconcile_body(None), topic="reconcile.a", source=b"reconcile"))
    assert keyed(unnamed.records) == [(b"tenant-a/uploads/x.txt", "tenant-a", "x.txt")]


@pytest.mark.parametrize(
    ("instance", "reason"),
    [
        (None, "names no instance"),
        ("tenant-z", "instance 'tenant-z' is not configured"),
    ],
)
def test_a_reconcile_delivery_without_a_known_instance_is_dead_lettered(
    instance: str | None, reason: str
) -> None:
    record = raw(reconcile_body(instance), topic="reconcile.any", source=b"reconcile")
    routed = scoped_route(record)
    assert [r.topic for r in routed.records] == [scoped().stream.dead_letter_topic]
    assert routed.dead_letter_reason is not None and reason in routed.dead_letter_reason


def test_a_delivery_with_more_events_than_its_provider_sends_is_dead_lettered_whole() -> None:
    """Issue 23 #8: MinIO sends one record per POST; 10,701 records made 10,701 events."""
    record_ = json.loads(MINIO_BODY)["Records"][0]
    many = json.dumps({"Records": [record_] * 3}).encode()
    routed = route(raw(many, topic="minio.events"), None, route_policy(SETTINGS))
    assert [r.topic for r in routed.records] == [DEAD_LETTER]
    assert routed.dead_letter_reason == (
        "minio: 3 events in one delivery, over the 1 one minio delivery holds at most "
        "(stream.max_events_per_delivery.minio)"
    )
    assert routed.records[0].value == many and routed.events == 0
    s3_many = raw(
        s3_body(*(s3_record(f"k{n}", sequencer=f"{n:04X}") for n in range(11))), source=b"s3"
    )
    assert route(s3_many, None, route_policy(SETTINGS)).dead_letter_reason == (
        "s3: 11 events in one delivery, over the 10 one s3 delivery holds at most "
        "(stream.max_events_per_delivery.s3)"
    )
    # The setting raises (or lowers) a source's bound.
    raised = SETTINGS.model_copy(
        update={
            "stream": SETTINGS.stream.model_copy(update={"max_events_per_delivery": {"s3": 11}})
        }
    )
    assert route(s3_many, None, route_policy(raised)).dead_letter_reason is None
    assert route(s3_many, None, route_policy(raised)).events == 11


def test_a_malformed_delivery_on_a_default_source_topic_names_that_source() -> None:
    assert_dead_letter(raw(b"{", topic="minio.events"), None, "", "minio: ")


@pytest.mark.skipif(
    not routing.__file__.endswith(".py"), reason="compiled: its call to normalize is not patchable"
)
def test_a_normalizer_bug_quoting_input_is_logged_on_escaped_lines(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The normalizer's exception may quote the delivery: the log line names it escaped, and
    the traceback's lines are the product's frames only."""
    forged = "[2026-12-07 03:00:00,000] [1] [CRITICAL] FORGED ok"

    def broken(delivery: object) -> list[FileEvent]:
        raise ValueError(f"bad field\n{forged}")

    monkeypatch.setattr(routing, "normalize", broken)
    with caplog.at_level(logging.ERROR, logger="streams.core.routing"):
        routed = route(raw(b"{}", source=f"s3\n{forged}".encode()), b"k", route_policy(SETTINGS))
    assert routed.dead_letter_reason == (
        f"s3\\n{forged}: internal error ValueError: bad field\\n{forged}"
    )
    [record] = caplog.records
    lines = record.getMessage().splitlines()
    assert lines[0].startswith("normalizer 's3\\n[2026-12-07")
    assert "Traceback (most recent call last):" in lines
    assert not [line for line in lines if line.startswith(forged)], lines
