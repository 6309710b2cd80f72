"""Backblaze B2 Event Notifications -> FileEvent. Fixture origins: fixtures/b2/ORIGINS.md."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from normalizer_support import (
    assert_malformed,
    assert_only_malformed_and_deterministic,
    deliver,
    encode,
    fixture_bytes,
    fixture_names,
    load_fixture,
    mostly,
    set_fields,
    webhook_bodies,
)

from streams.core.event import FileEvent
from streams.core.normalizers.b2 import SOURCE, normalize
from streams.core.normalizers.base import derived_id, record_hash_id

fixture = partial(fixture_bytes, SOURCE)
delivery = partial(deliver, SOURCE)


def real_event(**changes: Any) -> dict[str, Any]:
    """The real b2listen upload record with some fields changed (None removes a field).

    Deletes, hide markers and other kinds have no public payload: they are built this way
    from the documented fields (see ORIGINS.md).
    """
    record: dict[str, Any] = load_fixture(SOURCE, "b2listen_upload_2024-07-22.json")["events"][0]
    return set_fields(record, changes)


def body_of(*records: dict[str, Any]) -> bytes:
    return encode({"events": list(records)})


def test_real_upload_maps_every_field() -> None:
    [event] = normalize(delivery(fixture("b2listen_upload_2024-07-22.json")))
    raw = json.loads(fixture("b2listen_upload_2024-07-22.json"))["events"][0]
    assert event == FileEvent(
        id="547d65a102a5be92b07ec200d3a95cfe06248b02ee6f656e016609b25bf8cd59",
        type="created",
        key="images/raw/smiley.png",
        bucket="metadaddy-tester",
        size=23889,
        etag=None,
        version_id=raw["objectVersionId"],
        time=datetime(2024, 7, 22, 23, 46, 4, 421000, tzinfo=UTC),
        sequencer=None,
        provider="b2",
        version_only=None,
        raw=raw,
    )


def test_two_uploads_of_one_name_get_different_ids() -> None:
    [first] = normalize(delivery(fixture("b2listen_upload_2024-07-22.json")))
    [second] = normalize(delivery(fixture("b2listen_upload_2024-07-23.json")))
    assert first.key == second.key
    assert first.id != second.id
    assert second.time is not None and first.time is not None and second.time > first.time


def test_redelivery_gets_the_same_ids() -> None:
    for name in fixture_names(SOURCE):
        body = fixture(name)
        first = normalize(delivery(body, {"x-bz-event-notification-signature": "v1=aa"}))
        again = normalize(delivery(body))  # headers differ between attempts; ids must not
        assert [e.id for e in first] == [e.id for e in again], name


def test_sdk_record_without_event_id_derives_one_from_the_version() -> None:
    [event] = normalize(delivery(fixture("sdk_upload_without_event_id.json")))
    assert event.id == derived_id(
        "b2",
        "b2:ObjectCreated:Upload",
        "mySampleBucket",
        "objectName.txt",
        "4_zaea8c5bc362ae55070130333_f117c7bd5d6c6597c_d20230521_m235957_c001_v0001044_t0052_u01684713597235",
    )
    assert event.size == 10495842
    assert event.time == datetime(2023, 5, 22, 22, 8, 29, 123000, tzinfo=UTC)


def test_sdk_record_without_size_has_no_size() -> None:
    [event] = normalize(delivery(fixture("sdk_upload_null_size.json")))
    assert event.size is None
    assert event.type == "created"


def test_without_event_id_or_version_the_id_comes_from_time_then_from_the_record() -> None:
    timed = real_event(eventId=None, objectVersionId=None)
    [event] = normalize(delivery(body_of(timed)))
    assert event.id == derived_id(
        "b2",
        "b2:ObjectCreated:Upload",
        "metadaddy-tester",
        "images/raw/smiley.png",
        None,
        "2024-07-22T23:46:04.421000Z",
        None,
    )
    bare = real_event(eventId=None, objectVersionId=None, eventTimestamp=None)
    [event] = normalize(delivery(body_of(bare)))
    assert event.id == record_hash_id("b2", bare)
    assert event.time is None


@pytest.mark.parametrize(
    "kind", ["Upload", "MultipartUpload", "Copy", "Replica", "MultipartReplica", "FutureKind"]
)
def test_every_object_created_kind_is_created(kind: str) -> None:
    [event] = normalize(delivery(body_of(real_event(eventType=f"b2:ObjectCreated:{kind}"))))
    assert event.type == "created"
    assert event.version_only is None


@pytest.mark.parametrize("kind", ["Delete", "LifecycleRule"])
def test_object_deleted_removes_one_version_only(kind: str) -> None:
    # Built: no public ObjectDeleted payload. The size is passed through as given (§11 #20).
    record = real_event(eventType=f"b2:ObjectDeleted:{kind}", eventId="d" * 64)
    [event] = normalize(delivery(body_of(record)))
    assert event.type == "deleted"
    assert event.version_only is True
    assert event.id == "d" * 64
    assert event.version_id == record["objectVersionId"]
    assert event.size == 23889
    [event] = normalize(
        delivery(body_of(real_event(eventType=f"b2:ObjectDeleted:{kind}", objectSize=None)))
    )
    assert event.size is None


@pytest.mark.parametrize("kind", ["Hide", "LifecycleRule"])
def test_hide_marker_means_the_key_is_gone(kind: str) -> None:
    # Built: no public HideMarkerCreated payload; a third-party quote says objectSize is 0.
    record = real_event(eventType=f"b2:HideMarkerCreated:{kind}", eventId="e" * 64, objectSize=0)
    [event] = normalize(delivery(body_of(record)))
    assert event.type == "deleted"
    assert event.version_only is False
    assert event.size is None  # the marker's size, not the hidden file's
    assert event.key == "images/raw/smiley.png"


@pytest.mark.parametrize(
    "body",
    [
        fixture("sdk_test_event.json"),
        body_of(real_event(eventType="b2:MultipartUploadCreated:LiveRead")),
        b'{"events": []}',
    ],
)
def test_dropped_kinds_give_no_event(body: bytes) -> None:
    assert normalize(delivery(body)) == []


def test_a_batch_gives_its_events_in_order_and_skips_dropped_ones() -> None:
    records = [
        real_event(objectName="a.txt", eventId="1" * 64),
        real_event(eventType="b2:TestEvent", eventId="2" * 64),
        real_event(objectName="b.txt", eventType="b2:HideMarkerCreated:Hide", eventId="3" * 64),
        real_event(objectName="c.txt", eventType="b2:ObjectDeleted:Delete", eventId="4" * 64),
    ]
    events = normalize(delivery(body_of(*records)))
    assert [(e.key, e.type, e.id) for e in events] == [
        ("a.txt", "created", "1" * 64),
        ("b.txt", "deleted", "3" * 64),
        ("c.txt", "deleted", "4" * 64),
    ]
    assert [e.raw for e in events] == [records[0], records[2], records[3]]


@pytest.mark.parametrize(
    "name", ["my file.txt", "a+b.txt", "100%25 done.txt", "naïve/日本語/😀.png", "dir/ spaced /x"]
)
def test_keys_are_kept_raw(name: str) -> None:
    [event] = normalize(delivery(body_of(real_event(objectName=name))))
    assert event.key == name


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xff\xfe not json", "not JSON"),
        (b"[]", "body is not a JSON object"),
        (b"{}", "events is missing or not a list"),
        (b'{"events": {"0": {}}}', "events is missing or not a list"),
        (b'{"events": ["x"]}', r"events\[0\] is not a JSON object"),
        (body_of(real_event(eventType=None)), r"events\[0\]\.eventType is missing"),
        (body_of(real_event(eventType="b2:ObjectRestored:X")), "not a known B2 event type"),
        (body_of(real_event(objectName=None)), r"events\[0\]\.objectName is missing"),
        (body_of(real_event(objectName="")), r"events\[0\]\.objectName is missing"),
        (body_of(real_event(bucketName=7)), r"events\[0\]\.bucketName is missing"),
        (body_of(real_event(objectSize="big")), r"events\[0\]\.objectSize is not an integer"),
        (body_of(real_event(eventTimestamp="2024")), "eventTimestamp is not a number"),
        (body_of(real_event(eventTimestamp=10**30)), "eventTimestamp is out of range"),
        (body_of(real_event(eventId=5)), r"events\[0\]\.eventId is not a string"),
        (body_of(real_event(objectVersionId=[])), "objectVersionId is not a string"),
        (b'{"events": [' + b"1" * 5000 + b"]}", "not usable JSON"),
        (b'{"events": [{"objectName": "\\ud800"}]}', "lone UTF-16 surrogate"),
        (
            b'{"events": [], "deep": ' + b"[" * 70 + b'"\\ud800"' + b"]" * 70 + b"}",
            "lone UTF-16 surrogate",
        ),
        (b"[" * 100_000, "nested too deeply"),
    ],
)
def test_malformed_deliveries_say_why(body: bytes, message: str) -> None:
    assert_malformed(SOURCE, body, message)


# --- properties ------------------------------------------------------------------------

headers = st.dictionaries(st.text(max_size=30).map(str.lower), st.text(max_size=30), max_size=4)
b2_records = st.fixed_dictionaries(
    {
        "eventType": mostly(
            st.sampled_from(
                [
                    "b2:ObjectCreated:Upload",
                    "b2:ObjectDeleted:Delete",
                    "b2:HideMarkerCreated:Hide",
                    "b2:MultipartUploadCreated:LiveRead",
                    "b2:TestEvent",
                    "b2:Other",
                ]
            )
        ),
        "eventId": mostly(st.none() | st.text(alphabet="0123456789abcdef", max_size=8)),
        "bucketName": mostly(st.text(min_size=1, max_size=8)),
        "objectName": mostly(st.text(min_size=1, max_size=12)),
        "objectSize": mostly(st.none() | st.integers(0, 2**40)),
        "objectVersionId": mostly(st.none() | st.text(max_size=8)),
        "eventTimestamp": mostly(st.none() | st.integers(0, 2**42)),
    }
)
bodies = webhook_bodies(st.fixed_dictionaries({"events": st.lists(mostly(b2_records), max_size=4)}))


@settings(max_examples=300, deadline=None)
@given(body=bodies, extra_headers=headers)
def test_any_input_gives_events_or_malformed_and_stable_ids(
    body: bytes, extra_headers: dict[str, str]
) -> None:
    assert_only_malformed_and_deterministic(
        SOURCE, delivery(body, extra_headers), again=delivery(body)
    )
