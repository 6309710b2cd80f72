"""EventBridge (S3 source) normalizer: fixtures from AWS docs and powertools test events."""

from __future__ import annotations

import copy
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
    json_strategy,
    load_fixture,
    normalized,
    set_fields,
    single,
)

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers import normalize as registry_normalize
from streams.core.normalizers.eventbridge import SOURCE

fixture = partial(load_fixture, SOURCE)
run = partial(normalized, SOURCE)


def only(body: Any) -> FileEvent:
    return single(run(body))


def changed(body: Any, *, detail: dict[str, Any] | None = None, **obj: Any) -> Any:
    """A copy with `detail` fields and `detail.object` fields set (None removes one)."""
    body = copy.deepcopy(body)
    set_fields(body["detail"], detail or {})
    set_fields(body["detail"]["object"], obj)
    return body


def sns_envelope(event: Any) -> Any:
    """An EventBridge event delivered through an SNS target, as SQS receives it."""
    return {
        "Type": "Notification",
        "MessageId": "a5b2c3d4-0000-5f90-934d-d1705f7dea61",
        "TopicArn": "arn:aws:sns:ca-central-1:111122223333:s3-events",
        "Message": json.dumps(event),
        "Timestamp": "2021-11-12T00:00:01.000Z",
        "SignatureVersion": "1",
        "Signature": "c2lnbmF0dXJl",
        "SigningCertURL": "https://sns.ca-central-1.amazonaws.com/SimpleNotificationService-x.pem",
        "UnsubscribeURL": "https://sns.ca-central-1.amazonaws.com/?Action=Unsubscribe",
    }


# --- event kinds -----------------------------------------------------------------------


def test_object_created_from_docs() -> None:
    body = fixture("doc-object-created.json")
    event = only(body)
    assert event.id == "17793124-05d4-b198-2fde-7ededc63b103"
    assert event.type == "created"
    assert event.provider == "eventbridge"
    assert (event.bucket, event.key) == ("DOC-EXAMPLE-BUCKET1", "example-key")
    assert (event.size, event.etag) == (5, "b1946ac92492d2347c6235b4d2611184")
    assert event.version_id == "IYV3p45BT0ac8hjHg1houSdS1a.Mro8e"
    assert event.sequencer == "617f08299329d189"
    assert event.time == datetime(2021, 11, 12, tzinfo=UTC)
    assert event.version_only is None
    assert event.raw == body


def test_object_created_real_capture() -> None:
    event = only(fixture("powertools-object-created.json"))
    assert event.id == "f5f1e65c-dc3a-93ca-6c1e-b1647eac7963"
    assert (event.key, event.size, event.version_id) == ("IMG_m7fzo3.jpg", 184662, None)
    assert event.sequencer == "006408CAD69598B05E"
    assert event.time == datetime(2023, 3, 8, 17, 50, 14, tzinfo=UTC)


@pytest.mark.parametrize(
    "name",
    ["doc-object-deleted-delete-marker.json", "doc-object-deleted-lifecycle.json"],
)
def test_delete_marker_created_means_the_key_is_gone(name: str) -> None:
    event = only(fixture(name))
    assert (event.type, event.version_only) == ("deleted", False)
    assert event.version_id is not None  # the marker's version
    assert event.size is None


def test_deleted_without_version_from_powertools() -> None:
    event = only(fixture("powertools-object-deleted.json"))
    assert (event.type, event.version_only, event.version_id) == ("deleted", False, None)
    assert (event.etag, event.size) == (None, None)


def test_permanently_deleted_unversioned_object() -> None:
    # LS-EB: an unversioned permanent delete carries only key and sequencer.
    body = changed(
        fixture("powertools-object-deleted.json"), detail={"deletion-type": "Permanently Deleted"}
    )
    assert only(body).version_only is False


def test_permanently_deleted_version_may_leave_the_key() -> None:
    body = changed(
        fixture("doc-object-deleted-delete-marker.json"),
        detail={"deletion-type": "Permanently Deleted"},
    )
    event = only(body)
    assert (event.version_only, event.version_id) == (True, "1QW9g1Z99LUNbvaaYVpW9xDlOLU.qxgF")


def test_null_version_stays_a_string() -> None:
    body = changed(
        fixture("doc-object-deleted-delete-marker.json"),
        detail={"deletion-type": "Permanently Deleted"},
        **{"version-id": "null"},
    )
    assert (only(body).version_id, only(body).version_only) == ("null", True)


def test_delete_without_deletion_type_is_not_told() -> None:
    body = changed(fixture("doc-object-deleted-delete-marker.json"), detail={"deletion-type": None})
    assert only(body).version_only is None


@pytest.mark.parametrize(
    "detail_type",
    [
        "Object Restore Initiated",
        "Object Restore Completed",
        "Object Restore Expired",
        "Object Tags Added",
        "Object Tags Deleted",
        "Object ACL Updated",
        "Object Storage Class Changed",
        "Object Access Tier Changed",
        "Something Else",
    ],
)
def test_kinds_without_content_change_are_dropped(detail_type: str) -> None:
    body = fixture("doc-object-created.json")
    body["detail-type"] = detail_type
    assert run(body) == []


def test_restore_completed_from_docs_is_dropped() -> None:
    assert run(fixture("doc-object-restore-completed.json")) == []


# --- keys and fields -----------------------------------------------------------------------


@pytest.mark.parametrize("key", ["a b.txt", "a+b.txt", "100%25 done", "d/ü/你家.png", "x%2By"])
def test_keys_are_taken_verbatim(key: str) -> None:
    assert only(changed(fixture("doc-object-created.json"), key=key)).key == key


def test_moto_spelling_of_etag_is_accepted() -> None:
    body = changed(fixture("doc-object-created.json"), etag=None, eTag='"abc"')
    assert only(body).etag == "abc"


def test_quoted_etag_loses_one_pair_of_quotes() -> None:
    assert only(changed(fixture("doc-object-created.json"), etag='"abc"')).etag == "abc"


# --- ids across deliveries -----------------------------------------------------------------


def test_id_is_the_event_id_in_every_wrapper() -> None:
    event = fixture("powertools-object-created.json")
    replayed = {**event, "replay-name": "replay-2023"}  # EventBridge archive replay
    ids = {only(body).id for body in (event, sns_envelope(event), replayed)}
    assert ids == {"f5f1e65c-dc3a-93ca-6c1e-b1647eac7963"}


def test_delete_and_its_create_have_different_ids() -> None:
    created = only(fixture("powertools-object-created.json"))
    deleted = only(fixture("powertools-object-deleted.json"))
    assert created.sequencer == deleted.sequencer  # powertools reused it
    assert created.id != deleted.id


def test_registry_finds_the_module() -> None:
    body = json.dumps(fixture("doc-object-created.json")).encode()
    assert registry_normalize(Delivery(source="eventbridge", body=body)) == run(
        fixture("doc-object-created.json")
    )


# --- malformed input -----------------------------------------------------------------------


def test_other_event_sources_are_malformed() -> None:
    body = fixture("doc-object-created.json")
    body["source"] = "aws.ec2"
    assert_malformed(SOURCE, body, r"source 'aws\.ec2' is not 'aws\.s3'")


def test_an_s3_notification_sent_here_is_malformed() -> None:
    s3_body = {"Records": [{"eventName": "ObjectCreated:Put"}]}
    assert_malformed(SOURCE, s3_body, "source None")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not JSON"),
        (b"\x00\x01", "not JSON"),
        (b"[1, 2]", "EventBridge event is not a JSON object"),
        (b'{"source": "aws.s3"}', "detail-type is missing"),
        (b'{"source": "aws.s3", "detail-type": "Object Created"}', "id is missing"),
        (b'{"source": "aws.s3", "detail-type": "Object Created", "id": "x"}', "detail is not"),
        (
            b'{"source": "aws.s3", "detail-type": "Object Created", "id": "x", "detail": {}}',
            "detail.bucket is not",
        ),
        (
            b'{"source": "aws.s3", "detail-type": "Object Created", "id": "x",'
            b' "detail": {"bucket": {"name": "b"}, "object": {}}}',
            "detail.object.key is missing",
        ),
        (
            b'{"source": "aws.s3", "detail-type": "Object Created", "id": "x",'
            b' "detail": {"bucket": {"name": 1}, "object": {"key": "k"}}}',
            "detail.bucket.name is missing",
        ),
        (b'{"Type": "SubscriptionConfirmation", "Message": "m"}', "not a notification"),
        (b'{"Type": "Notification", "Message": "[]"}', "SNS Message is not a JSON object"),
        (b'{"source": "aws.s3", "detail-type": "\\udfff"}', "surrogate"),
    ],
)
def test_malformed_bodies_say_why(body: bytes, message: str) -> None:
    assert_malformed(SOURCE, body, message)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("size", "five", "size is not an integer"),
        ("size", True, "size is not an integer"),
        ("etag", 5, "etag is not a string"),
        ("version-id", 1, "version-id is not a string"),
        ("sequencer", [], "sequencer is not a string"),
    ],
)
def test_wrong_field_types_are_malformed(field: str, value: Any, message: str) -> None:
    assert_malformed(SOURCE, changed(fixture("doc-object-created.json"), **{field: value}), message)


@pytest.mark.parametrize("value", ["soon", 1636675200, "9999-12-31T23:59:59-01:00"])
def test_bad_time_is_malformed(value: Any) -> None:
    body = fixture("doc-object-created.json")
    body["time"] = value
    assert_malformed(SOURCE, body, "time")


# --- properties ----------------------------------------------------------------------------

json_values = json_strategy(max_text=None, max_key=12, max_leaves=20)


@settings(max_examples=300)
@given(st.binary())
def test_arbitrary_bytes_never_escape(body: bytes) -> None:
    assert_only_malformed_and_deterministic(SOURCE, body)


@settings(max_examples=300)
@given(json_values)
def test_arbitrary_json_never_escapes(value: Any) -> None:
    assert_only_malformed_and_deterministic(SOURCE, value)
    assert_only_malformed_and_deterministic(
        SOURCE, {"Type": "Notification", "Message": json.dumps(value)}
    )


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["id", "detail-type", "time", "detail", "resources"]),
            json_values,
        ),
        max_size=3,
    ),
    st.lists(
        st.tuples(
            st.sampled_from(["key", "size", "etag", "eTag", "version-id", "sequencer"]),
            json_values,
        ),
        max_size=3,
    ),
    st.sampled_from(["Object Created", "Object Deleted"]),
)
def test_mutated_real_events_never_escape(
    top: list[tuple[str, Any]], obj: list[tuple[str, Any]], detail_type: str
) -> None:
    body = fixture("doc-object-deleted-delete-marker.json")
    body["detail-type"] = detail_type
    for name, value in obj:
        body["detail"]["object"][name] = value
    for name, value in top:
        body[name] = value
    assert_only_malformed_and_deterministic(SOURCE, body)
