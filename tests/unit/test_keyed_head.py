"""The keyed record's head (streams.core.keyedhead): stage two reads only the head, and what
it reads there is what it read from the event's JSON; records of the previous two formats
(no head; the first format's `{"instance", "event"}`) are still read, and a head of a version
this worker does not know is refused, never misread."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.core.delivery import Delivery
from streams.core.event import FileEvent, format_time
from streams.core.keyedhead import HEAD_RAW_FIELDS, KEYED_HEAD_VERSION, pack_head
from streams.core.normalizers import MalformedDelivery, normalize
from streams.core.ordering import order_token, scope
from streams.core.records import (
    KEYED_HEAD_HEADER,
    KeyedEvent,
    keyed_output_record,
    keyed_record,
    output_record,
    parse_keyed,
)

FIXTURES = Path(__file__).parents[1] / "normalizers" / "fixtures"


def _fixture_events() -> list[FileEvent]:
    """Every event the normalizers make of the normalizer tests' fixture files."""
    events: list[FileEvent] = []
    for path in sorted(FIXTURES.glob("*/*.json")):
        source = path.parent.name
        headers = {"x-appwrite-webhook-events": "buckets.b.files.f.create"}
        try:
            events += normalize(Delivery(source, path.read_bytes(), headers))
        except MalformedDelivery:
            continue
    return events


FIXTURE_EVENTS = _fixture_events()
EDGE_EVENTS = [
    FileEvent(id="x:1", type="created", key="k", provider="s3"),
    FileEvent(
        id="x:2",
        type="deleted",
        key="a b/\u00e9.txt",
        bucket="b",
        provider="gcs",
        sequencer="1700000000000001",
        version_only=True,
        etag="e",
        time=datetime(2026, 11, 30, 1, 2, 3, 450000, tzinfo=UTC),
        raw={"metageneration": "3", "other": [1, {"deep": None}]},
    ),
    FileEvent(
        id="x:3",
        type="created",
        key="k",
        provider="azure",
        sequencer="000001",
        raw={
            "topic": {"not": "a string"},
            "source": "/subscriptions/s/resourceGroups/g/"
            "providers/Microsoft.Storage/storageAccounts/Acct1/blobServices/default",
        },
    ),
    FileEvent(
        id="x:4",
        type="created",
        key="k",
        provider="s3",
        sequencer="0A",
        raw={"awsRegion": "cn-north-1", "region": 1.5, "source": True},
    ),
    FileEvent(id="x:5", type="deleted", key="k", provider="s3", raw={}),
]


def _json_read(record_value: bytes, headers: dict[str, bytes]) -> KeyedEvent:
    """What stage two reads of the record as the previous release wrote it: no head."""
    return parse_keyed(record_value, {k: v for k, v in headers.items() if k != KEYED_HEAD_HEADER})


def _same_decisions(head: KeyedEvent, previous: KeyedEvent) -> None:
    for name in (
        "instance",
        "id",
        "type",
        "key",
        "bucket",
        "provider",
        "sequencer",
        "time",
        "time_text",
        "version_only",
        "etag",
        "value",
    ):
        assert getattr(head, name) == getattr(previous, name), name
    assert type(head.time_text) is type(previous.time_text)
    assert scope(head) == scope(previous)
    assert order_token(head) == order_token(previous)
    raw = previous.raw
    expected = None if raw is None else {k: raw[k] for k in HEAD_RAW_FIELDS if k in raw}
    assert head.raw == expected


def test_the_fixtures_give_events_of_every_source() -> None:
    assert {event.provider for event in FIXTURE_EVENTS} >= {
        "s3",
        "eventbridge",
        "gcs",
        "azure",
        "minio",
        "b2",
        "box",
        "cloudinary",
    }


@pytest.mark.parametrize("event", FIXTURE_EVENTS + EDGE_EVENTS, ids=lambda event: event.id[:40])
def test_the_head_reads_as_the_json_did(event: FileEvent) -> None:
    record = keyed_record("by-key", "tenant-a", event, b"17")
    headers = dict(record.headers)
    assert headers[KEYED_HEAD_HEADER][0] == KEYED_HEAD_VERSION
    assert record.value is not None
    head = parse_keyed(record.value, headers)
    _same_decisions(head, _json_read(record.value, headers))
    # The value is passed through unread, and is the output's value byte for byte.
    assert head.value is record.value
    assert keyed_output_record("out", head) == output_record("out", "tenant-a", event)


@given(
    st.dictionaries(
        st.sampled_from([*HEAD_RAW_FIELDS, "x"]),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(2**63), 2**64 - 1)
            | st.text()
            | st.floats(allow_nan=False, allow_infinity=False),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=5), inner, max_size=3)
            ),
            max_leaves=8,
        ),
    ),
    st.sampled_from(["s3", "eventbridge", "gcs", "azure", "b2"]),
    st.none() | st.text(max_size=20),
)
def test_any_raw_fields_read_as_the_json_did(
    raw: dict[str, Any], provider: str, sequencer: str | None
) -> None:
    event = FileEvent(
        id="i", type="created", key="k", provider=provider, sequencer=sequencer, raw=raw
    )
    record = keyed_record("by-key", "a", event, None)
    assert record.value is not None
    headers = dict(record.headers)
    assert KEYED_HEAD_HEADER in headers
    _same_decisions(parse_keyed(record.value, headers), _json_read(record.value, headers))


def test_a_raw_field_messagepack_cannot_hold_leaves_the_record_without_a_head() -> None:
    event = FileEvent(
        id="g",
        type="created",
        key="k",
        provider="gcs",
        sequencer="5",
        raw={"metageneration": 2**70},
    )
    assert pack_head(event) is None
    record = keyed_record("by-key", "a", event, None)
    assert KEYED_HEAD_HEADER not in dict(record.headers)
    assert record.value is not None
    keyed = parse_keyed(record.value, dict(record.headers))
    # Read from the JSON, as the previous release read it: orjson reads the integer as a
    # float, which is no metageneration (0). The head changes no decision, this one included.
    assert keyed.raw == {"metageneration": float(2**70)}
    assert order_token(keyed) == ("gcs-generation", (5, 0, 0))


def test_records_of_the_previous_formats_are_read_as_before() -> None:
    """An upgrade in place: the repartition topic holds what the previous release wrote."""
    event = EDGE_EVENTS[1]
    new = parse_keyed(*_value_and_headers(keyed_record("by-key", "a", event, b"17")))
    without_head = json.loads(json.dumps(event.model_dump(mode="json")))
    value = output_record("out", "a", event).value
    assert value is not None
    previous = parse_keyed(value, {"instance": b"a", "received-at": b"17"})
    first = parse_keyed(
        json.dumps({"instance": "a", "event": without_head}).encode(), {"received-at": b"17"}
    )
    for old in (previous, first):
        _same_decisions(new, old)


def _value_and_headers(record: object) -> tuple[bytes, dict[str, bytes]]:
    value, headers = record.value, dict(record.headers)  # type: ignore[attr-defined]
    assert isinstance(value, bytes)
    return value, headers


@pytest.mark.parametrize(
    ("head", "headers"),
    [
        (
            bytes((2,)) + msgspec.msgpack.encode(["i", "created", "k", None, "s3"]),
            {"instance": b"a"},
        ),
        (b"", {"instance": b"a"}),
        (b"\x01", {"instance": b"a"}),
        (b"\x01\xc1", {"instance": b"a"}),
        (
            b"\x01"
            + msgspec.msgpack.encode(["i", "moved", "k", None, "s3", None, None, None, None, None]),
            {"instance": b"a"},
        ),
        (
            b"\x01"
            + msgspec.msgpack.encode([1, "created", "k", None, "s3", None, None, None, None, None]),
            {"instance": b"a"},
        ),
        (b"\x01" + msgspec.msgpack.encode(["i", "created", "k"]), {"instance": b"a"}),
        (
            b"\x01"
            + msgspec.msgpack.encode(
                ["i", "created", "k", None, "s3", None, "2026-11-30T00:00:00", None, None, None]
            ),
            {"instance": b"a"},
        ),
        (
            b"\x01"
            + msgspec.msgpack.encode(
                ["i", "created", "k", None, "s3", None, "yesterday", None, None, None]
            ),
            {"instance": b"a"},
        ),
        (
            b"\x01"
            + msgspec.msgpack.encode(
                ["i", "created", "k", None, "s3", None, None, "yes", None, None]
            ),
            {"instance": b"a"},
        ),
        (
            b"\x01"
            + msgspec.msgpack.encode(
                ["i", "created", "k", None, "s3", None, None, None, None, None]
            ),
            {},
        ),
    ],
)
def test_an_unreadable_or_newer_head_is_refused(head: bytes, headers: dict[str, bytes]) -> None:
    with pytest.raises(ValueError):
        parse_keyed(
            b'{"id": "i", "type": "created", "key": "k", "provider": "s3"}',
            {**headers, KEYED_HEAD_HEADER: head},
        )


def test_elements_appended_to_a_version_1_head_are_ignored() -> None:
    """The next release may add fields at the end of version 1: this one still reads it."""
    head = b"\x01" + msgspec.msgpack.encode(
        ["i", "created", "k", "b", "s3", "0A", "2026-11-30T00:00:00Z", None, "e", None, "new", 7]
    )
    keyed = parse_keyed(b"{}", {"instance": b"a", KEYED_HEAD_HEADER: head})
    assert (keyed.id, keyed.bucket, keyed.sequencer, keyed.etag) == ("i", "b", "0A", "e")
    assert keyed.time == datetime(2026, 11, 30, tzinfo=UTC)


@given(
    st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.timezones()
    )
)
def test_the_head_time_is_the_json_time(time: datetime) -> None:
    event = FileEvent(id="i", type="deleted", key="k", provider="s3", time=time)
    record = keyed_record("by-key", "a", event, None)
    assert record.value is not None
    headers = dict(record.headers)
    head = parse_keyed(record.value, headers)
    assert head.time_text == json.loads(record.value)["time"] == format_time(time)
    assert head.time == event.time
    _same_decisions(head, _json_read(record.value, headers))


def test_a_time_outside_utc_is_written_as_the_json_writes_it() -> None:
    """from_checked vouches for UTC; a time it was handed in another zone still reads alike."""
    time = datetime(2026, 11, 30, 2, 0, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    event = FileEvent.from_checked(
        id="i",
        type="created",
        key="k",
        bucket=None,
        size=None,
        etag=None,
        version_id=None,
        time=time,
        sequencer=None,
        provider="s3",
        version_only=None,
        raw=None,
    )
    record = keyed_record("by-key", "a", event, None)
    assert record.value is not None
    head = parse_keyed(record.value, dict(record.headers))
    assert head.time_text == "2026-11-30T00:00:00.000005Z"
    _same_decisions(head, _json_read(record.value, dict(record.headers)))
