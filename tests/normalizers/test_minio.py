"""MinIO notification normalizer: fixtures from MinIO docs, an issue and real captures."""

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
    single,
    with_s3_record,
)

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers import normalize as registry_normalize
from streams.core.normalizers.base import derived_id, record_hash_id
from streams.core.normalizers.minio import SOURCE

VERSION_UUID = "7ead3921-78e0-441a-a939-c772d69c34a2"

fixture = partial(load_fixture, SOURCE)
run = partial(normalized, SOURCE)


def only(body: Any) -> FileEvent:
    return single(run(body))


def with_record(body: Any, **changes: Any) -> Any:
    """A copy with record fields or s3.object fields set, as `with_s3_record` makes it;
    `EventName` follows the record's `eventName`, as MinIO sends it."""
    body = with_s3_record(body, **changes)
    if "eventName" in changes and "EventName" in body:
        body["EventName"] = changes["eventName"]
    return body


PUT = "nnsay-webhook-put.json"
DELETE = "nnsay-webhook-delete.json"


# --- event kinds -----------------------------------------------------------------------


def test_webhook_put_real_capture() -> None:
    body = fixture(PUT)
    event = only(body)
    assert event.type == "created"
    assert event.provider == "minio"
    assert event.bucket == "vd-main"
    assert event.key == "Tile_+002_+002.mtl"  # record key Tile_%2B002_%2B002.mtl
    assert (event.size, event.etag) == (210, "775ff5def9531772a2bb12853cd46fce")
    assert (event.version_id, event.version_only) == (None, None)
    assert event.sequencer == "17A76FE05CF3469B"
    assert event.time == datetime(2024, 1, 5, 11, 26, 33, 408000, tzinfo=UTC)
    assert event.raw == body["Records"][0]
    assert event.id == derived_id(
        "minio", "s3:ObjectCreated:Put", "vd-main", "Tile_+002_+002.mtl", "17A76FE05CF3469B"
    )


def test_webhook_delete_real_capture() -> None:
    event = only(fixture(DELETE))
    assert (event.type, event.key, event.version_only) == ("deleted", "Tile_+002_+002.mtl", False)
    assert (event.size, event.etag, event.version_id) == (None, None, None)
    assert event.id != only(fixture(PUT)).id


def test_top_level_key_is_never_decoded_again() -> None:
    # `Key` says "vd-main/Tile_+002_+002.mtl" (already decoded); decoding it would give spaces.
    body = fixture(PUT)
    body["Key"] = "vd-main/garbage"
    assert only(body).key == "Tile_+002_+002.mtl"


@pytest.mark.parametrize(
    "name",
    [
        "s3:ObjectCreated:Put",
        "s3:ObjectCreated:Post",
        "s3:ObjectCreated:Copy",
        "s3:ObjectCreated:CompleteMultipartUpload",
    ],
)
def test_created_kinds(name: str) -> None:
    event = only(with_record(fixture(PUT), eventName=name))
    assert event.type == "created"
    assert event.raw is not None and event.raw["eventName"] == name


def test_versioned_delete_of_one_version() -> None:
    event = only(with_record(fixture(DELETE), versionId=VERSION_UUID))
    assert (event.type, event.version_id, event.version_only) == ("deleted", VERSION_UUID, True)


@pytest.mark.parametrize(
    "name",
    [
        "s3:ObjectRemoved:DeleteMarkerCreated",
        "s3:ObjectRemoved:DeleteAllVersions",
        "s3:LifecycleDelMarkerExpiration:Delete",
    ],
)
def test_deletes_that_leave_no_live_object(name: str) -> None:
    event = only(with_record(fixture(DELETE), eventName=name, versionId=VERSION_UUID))
    assert (event.type, event.version_only, event.version_id) == ("deleted", False, VERSION_UUID)


@pytest.mark.parametrize(
    "name",
    [
        "s3:ObjectCreated:PutRetention",
        "s3:ObjectCreated:PutLegalHold",
        "s3:ObjectCreated:PutTagging",
        "s3:ObjectCreated:DeleteTagging",
        "s3:ObjectRemoved:NoOP",
        "s3:ObjectAccessed:Get",
        "s3:ObjectAccessed:Head",
        "s3:ObjectAccessed:GetRetention",
        "s3:ObjectAccessed:GetLegalHold",
        "s3:ObjectAccessed:Attributes",
        "s3:Replication:OperationCompletedReplication",
        "s3:Replication:OperationFailedReplication",
        "s3:ObjectRestore:Post",
        "s3:ObjectRestore:Completed",
        "s3:ObjectTransition:Complete",
        "s3:ObjectTransition:Failed",
        "s3:Scanner:ManyVersions",
        "s3:Scanner:BigPrefix",
        "s3:BucketCreated:*",
        "s3:BucketRemoved:*",
        "ObjectCreated:Put",  # AWS spelling: not a MinIO name
    ],
)
def test_kinds_without_content_change_are_dropped(name: str) -> None:
    assert run(with_record(fixture(PUT), eventName=name)) == []


def test_bucket_event_without_object_key_is_dropped_not_malformed() -> None:
    body = with_record(fixture(PUT), eventName="s3:BucketCreated:*", key="")
    assert run(body) == []


# --- legacy and old formats ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["xopera-legacy-version-1.json", "docs-kafka-put.json"])
def test_legacy_version_placeholder_is_no_version(name: str) -> None:
    body = fixture(name)
    event = only(body)
    assert event.type == "created"
    assert event.version_id is None
    assert event.raw is not None and event.raw["s3"]["object"]["versionId"] == "1"


def test_legacy_delete_with_placeholder_removes_the_live_object() -> None:
    body = with_record(fixture("xopera-legacy-version-1.json"), eventName="s3:ObjectRemoved:Delete")
    event = only(body)
    assert (event.type, event.version_id, event.version_only) == ("deleted", None, False)


def test_docs_kafka_example() -> None:
    event = only(fixture("docs-kafka-put.json"))
    assert (event.bucket, event.key, event.size) == ("images", "myphoto.jpg", 6474)
    assert event.etag == "430f89010c77aa34fc8760696da62d08-1"
    assert event.time == datetime(2019, 9, 10, 17, 41, 54, tzinfo=UTC)


def test_2017_format_with_aws_event_source() -> None:
    event = only(fixture("docs-mysql-2017-put.json"))
    assert (event.bucket, event.key, event.sequencer) == (
        "images",
        "myphoto.jpg",
        "14AC59476F809FD3",
    )


def test_redacted_issue_payload_without_bucket_is_malformed() -> None:
    assert_malformed(
        SOURCE,
        fixture("issue-15200-redacted-post.json"),
        r"Records\[0\]\.s3\.bucket\.name is missing",
    )


def test_record_without_any_marker_hashes_the_record() -> None:
    body = fixture("issue-15200-redacted-post.json")
    body["Records"][0]["s3"]["bucket"]["name"] = "uploads"
    event = only(body)
    assert event.key == "users/ABC"
    assert (event.sequencer, event.etag, event.time) == (None, None, None)
    assert event.id == record_hash_id("minio", body["Records"][0])


# --- keys ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoded", "key"),
    [
        ("a+b%2Bc%2F%C3%BC.txt", "a b+c/ü.txt"),  # Go url.QueryEscape("a b+c/ü.txt")
        ("users%2FABC", "users/ABC"),
        ("%E9%9C%80%E6%B1%82.md", "需求.md"),
        (
            "Remark+%E6%8F%92%E4%BB%B6%E6%B5%8B%E8%AF%95%2Fremark-comment.md",
            "Remark 插件测试/remark-comment.md",
        ),
        ("100%25", "100%"),
    ],
)
def test_record_keys_are_form_decoded(encoded: str, key: str) -> None:
    assert only(with_record(fixture(PUT), key=encoded)).key == key


# --- ids across deliveries -----------------------------------------------------------------


def test_queue_store_replay_and_other_targets_get_one_id() -> None:
    webhook = fixture(PUT)
    kafka = {
        "EventName": webhook["EventName"],
        "Key": webhook["Key"],
        "Records": webhook["Records"],
    }
    amqp_2016 = {"Records": webhook["Records"], "level": "info", "msg": "", "time": "2024-01-05"}
    ids = {only(body).id for body in (webhook, copy.deepcopy(webhook), kafka, amqp_2016)}
    assert len(ids) == 1


def test_several_records_in_order() -> None:
    put, delete = fixture(PUT)["Records"][0], fixture(DELETE)["Records"][0]
    assert [e.type for e in run({"Records": [delete, put]})] == ["deleted", "created"]


def test_registry_finds_the_module() -> None:
    body = json.dumps(fixture(PUT)).encode()
    assert registry_normalize(Delivery(source="minio", body=body)) == run(fixture(PUT))


# --- malformed input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not JSON"),
        (b"\x80", "not JSON"),
        (b"null", "MinIO notification is not a JSON object"),
        (b'{"EventName": "s3:ObjectCreated:Put", "Key": "b/k"}', "no Records array"),
        (b'{"Records": "x"}', "no Records array"),
        (b'{"Records": [[]]}', r"Records\[0\] is not a JSON object"),
        (b'{"Records": [{"eventName": 1}]}', r"Records\[0\]\.eventName is missing"),
        (b'{"Records": [{"eventSource": "aws:sns", "eventName": "x"}]}', "not one of"),
        (b'{"Records": [{"eventName": "s3:ObjectCreated:Put", "s3": []}]}', r"\.s3 is not"),
        (
            b'{"Records": [{"eventName": "s3:ObjectCreated:Put",'
            b' "s3": {"bucket": {"name": "b"}, "object": {"key": "%C3"}}}]}',
            "percent-encoded UTF-8",
        ),
        (b'{"Records": [], "Key": "\\ud800"}', "surrogate"),
    ],
)
def test_malformed_bodies_say_why(body: bytes, message: str) -> None:
    assert_malformed(SOURCE, body, message)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("size", "1e3", "size is not an integer"),
        ("sequencer", 17, "sequencer is not a string"),
        ("versionId", True, "versionId is not a string"),
        ("eTag", 0, "eTag is not a string"),
        # The MinIO docs' AMQP example has en dashes in its time.
        ("eventTime", "2016\u201309\u201308T22:34:38.226Z", "not an RFC 3339 time"),
    ],
)
def test_wrong_field_types_are_malformed(field: str, value: Any, message: str) -> None:
    assert_malformed(SOURCE, with_record(fixture(PUT), **{field: value}), message)


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
    assert_only_malformed_and_deterministic(SOURCE, {"Records": [value]})


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "eventName",
                    "eventTime",
                    "eventSource",
                    "key",
                    "size",
                    "eTag",
                    "versionId",
                    "sequencer",
                ]
            ),
            json_values,
        ),
        max_size=4,
    ),
    st.sampled_from(["s3:ObjectCreated:Put", "s3:ObjectRemoved:Delete"]),
)
def test_mutated_real_records_never_escape(changes: list[tuple[str, Any]], name: str) -> None:
    body = with_record(fixture(DELETE), eventName=name)
    for field, value in changes:
        body = with_record(body, **{field: value if value is not None else 0})
    assert_only_malformed_and_deterministic(SOURCE, body)
