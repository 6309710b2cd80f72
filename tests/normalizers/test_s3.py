"""S3 notification normalizer: fixtures from AWS docs and public SDK/project test data."""

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
    json_strategy,
    load_fixture,
    normalized,
    outcome,
    single,
    with_s3_record,
)

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers import normalize as registry_normalize
from streams.core.normalizers.base import derived_id, record_hash_id
from streams.core.normalizers.s3 import SNS_NOTIFICATION_FIELDS, SOURCE

fixture = partial(load_fixture, SOURCE)
run = partial(normalized, SOURCE)


def only(body: Any) -> FileEvent:
    return single(run(body))


def sns_message(name: str) -> Any:
    """The S3 JSON inside one of the kafka-bind SNS envelopes."""
    return json.loads(fixture(name)["Message"])


def sns_envelope(s3_json: Any, message_id: str = "11111111-2222-3333-4444-555555555555") -> Any:
    """An SNS Notification as SQS delivers it with raw delivery off (see SNS-SIG)."""
    return {
        "Type": "Notification",
        "MessageId": message_id,
        "TopicArn": "arn:aws:sns:us-west-2:123456789012:bucket-topic",
        "Subject": "Amazon S3 Notification",
        "Message": json.dumps(s3_json),
        "Timestamp": "2018-02-26T00:08:07.095Z",
        "SignatureVersion": "1",
        "Signature": "c2lnbmF0dXJl",
        "SigningCertURL": "https://sns.us-west-2.amazonaws.com/SimpleNotificationService-x.pem",
        "UnsubscribeURL": "https://sns.us-west-2.amazonaws.com/?Action=Unsubscribe",
    }


def lambda_sns_event(s3_json: Any) -> Any:
    """The Lambda SNS event shape: `Records[].Sns.Message`."""
    return {
        "Records": [
            {
                "EventSource": "aws:sns",
                "EventVersion": "1.0",
                "EventSubscriptionArn": "arn:aws:sns:us-west-2:123456789012:bucket-topic:x",
                "Sns": {
                    "Type": "Notification",
                    "MessageId": "99999999-2222-3333-4444-555555555555",
                    "TopicArn": "arn:aws:sns:us-west-2:123456789012:bucket-topic",
                    "Subject": "Amazon S3 Notification",
                    "Message": json.dumps(s3_json),
                    "Timestamp": "2018-02-26T00:08:07.095Z",
                    "SignatureVersion": "1",
                    "Signature": "c2lnbmF0dXJl",
                    "SigningCertUrl": "https://sns.us-west-2.amazonaws.com/x.pem",
                    "UnsubscribeUrl": "https://sns.us-west-2.amazonaws.com/?Action=Unsubscribe",
                    "MessageAttributes": {},
                },
            }
        ]
    }


# --- event kinds -----------------------------------------------------------------------


def test_put_from_docs() -> None:
    body = fixture("doc-put.json")
    event = only(body)
    assert event.type == "created"
    assert event.provider == "s3"
    assert event.bucket == "mybucket"
    assert event.key == "HappyFace.jpg"
    assert event.size == 1024
    assert event.etag == "d41d8cd98f00b204e9800998ecf8427e"
    assert event.version_id == "096fKKXTRTtl3on89fVO.nfljtsv6qko"
    assert event.sequencer == "0055AED6DCD90281E5"
    assert event.time == datetime(1970, 1, 1, tzinfo=UTC)
    assert event.version_only is None
    assert event.raw == body["Records"][0]
    assert event.id == derived_id(
        "s3", "ObjectCreated:Put", "mybucket", "HappyFace.jpg", "0055AED6DCD90281E5"
    )


@pytest.mark.parametrize(
    ("name", "event_name", "size", "etag"),
    [
        ("kafka-bind-sns-put.json", "ObjectCreated:Put", 336, "9e30708dc09064bb76d8460c08cbabcb"),
        ("kafka-bind-sns-copy.json", "ObjectCreated:Copy", 336, None),
        (
            "kafka-bind-sns-complete-multipart-upload.json",
            "ObjectCreated:CompleteMultipartUpload",
            6442450944,
            "767e7a8379c0f62c39e0ceeea0e13de9-768",
        ),
    ],
)
def test_created_kinds_in_sns_envelopes(
    name: str, event_name: str, size: int, etag: str | None
) -> None:
    event = only(fixture(name))
    assert event.type == "created"
    assert event.raw is not None and event.raw["eventName"] == event_name
    assert (event.key, event.bucket) == ("1.2.3.4-1514864593.00", "bucket-name")
    assert (event.size, event.etag, event.version_id) == (size, etag, None)


def test_post_with_null_version_keeps_the_string_null() -> None:
    event = only(fixture("hmrc-post-null-version.json"))
    assert event.type == "created"
    assert event.raw is not None and event.raw["eventName"] == "ObjectCreated:Post"
    assert event.version_id == "null"
    assert event.sequencer == "005A8FCAA6B34C4355"


def test_copy_without_etag() -> None:
    event = only(fixture("hmrc-copy-null-version.json"))
    assert (event.type, event.etag, event.size, event.version_id) == ("created", None, 1024, "null")


def test_unversioned_delete_removes_the_live_object() -> None:
    event = only(fixture("kafka-bind-sns-object-removed.json"))
    assert event.type == "deleted"
    assert event.version_only is False
    assert (event.size, event.etag, event.version_id) == (None, None, None)
    assert event.sequencer == "005A937AB75B924C8A"
    assert event.time == datetime(2018, 2, 26, 3, 10, 47, 522000, tzinfo=UTC)


def test_delete_of_one_version_may_leave_the_key() -> None:
    # No public capture shows this; the docs describe it (S3-TYPES). Built from a real delete.
    body = with_s3_record(
        sns_message("kafka-bind-sns-object-removed.json"), versionId="3HL4kqtJlcpXroDTDmJ"
    )
    event = only(body)
    assert (event.type, event.version_id, event.version_only) == (
        "deleted",
        "3HL4kqtJlcpXroDTDmJ",
        True,
    )


def test_delete_of_the_null_version_is_a_version_delete() -> None:
    body = with_s3_record(sns_message("kafka-bind-sns-object-removed.json"), versionId="null")
    event = only(body)
    assert (event.version_id, event.version_only) == ("null", True)


def test_delete_marker_created() -> None:
    event = only(fixture("jayanta-sqs-body-delete-marker-created.json"))
    assert event.type == "deleted"
    assert event.version_only is False
    assert event.version_id == "vKYoCpCBU_hb4vsOMyC_UOKobVstiIoV"  # the marker's version
    assert event.etag == "d41d8cd98f00b204e9800998ecf8427e"
    assert event.size is None
    assert (event.bucket, event.key) == ("jayanta-s3-bucket", "hello.txt")


def test_lifecycle_expiration_delete_unversioned() -> None:
    event = only(fixture("doc-lifecycle-expiration-delete.json"))
    assert (event.type, event.key, event.version_only) == ("deleted", "expiration/delete", False)
    assert event.id == derived_id(
        "s3", "LifecycleExpiration:Delete", "mybucket", "expiration/delete", "0055AED6DCD90281E5"
    )


def test_lifecycle_expiration_delete_of_a_version() -> None:
    body = with_s3_record(fixture("doc-lifecycle-expiration-delete.json"), versionId="v1")
    assert only(body).version_only is True


def test_lifecycle_delete_marker_created() -> None:
    body = with_s3_record(
        fixture("doc-lifecycle-expiration-delete.json"),
        eventName="LifecycleExpiration:DeleteMarkerCreated",
        versionId="marker-v",
    )
    event = only(body)
    assert (event.type, event.version_only, event.version_id) == ("deleted", False, "marker-v")


def test_same_key_and_sequencer_but_other_kind_gets_another_id() -> None:
    put = with_s3_record(
        fixture("doc-lifecycle-expiration-delete.json"), eventName="ObjectCreated:Put"
    )
    deleted = fixture("doc-lifecycle-expiration-delete.json")
    assert only(put).id != only(deleted).id


# --- dropped kinds and the test event ----------------------------------------------------


@pytest.mark.parametrize(
    "event_name",
    [
        "ObjectRestore:Post",
        "ObjectRestore:Completed",
        "ObjectRestore:Delete",
        "Replication:OperationFailedReplication",
        "Replication:OperationReplicatedAfterThreshold",
        "ObjectTagging:Put",
        "ObjectTagging:Delete",
        "ObjectAcl:Put",
        "LifecycleTransition",
        "IntelligentTiering",
        "ReducedRedundancyLostObject",
        "SomethingNew:Happened",
    ],
)
def test_kinds_without_content_change_are_dropped(event_name: str) -> None:
    assert run(with_s3_record(fixture("doc-put.json"), eventName=event_name)) == []


def test_sdk_glacier_restore_with_s3_prefix_is_dropped() -> None:
    assert run(fixture("aws-lambda-go-s3-glacier-event.json")) == []


def test_s3_prefixed_created_name_is_tolerated() -> None:
    body = with_s3_record(fixture("doc-put.json"), eventName="s3:ObjectCreated:Put")
    event = only(body)
    assert event.type == "created"
    assert event.id != only(fixture("doc-put.json")).id  # the verbatim name is in the id


def test_dropped_kind_is_not_parsed_further() -> None:
    body = with_s3_record(fixture("doc-put.json"), eventName="ObjectTagging:Put")
    body["Records"][0]["s3"] = "not an object"
    assert run(body) == []


def test_test_event_gives_no_events() -> None:
    assert run(fixture("doc-test-event.json")) == []
    assert run(fixture("kafka-bind-sns-test-event.json")) == []


def test_several_records_give_several_events_in_order() -> None:
    put = fixture("doc-put.json")["Records"][0]
    marker = fixture("jayanta-sqs-body-delete-marker-created.json")["Records"][0]
    restore = fixture("aws-lambda-go-s3-glacier-event.json")["Records"][0]
    events = run({"Records": [marker, restore, put]})
    assert [(e.type, e.key) for e in events] == [
        ("deleted", "hello.txt"),
        ("created", "HappyFace.jpg"),
    ]


def test_empty_records_give_no_events() -> None:
    assert run({"Records": []}) == []


# --- keys ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoded", "key"),
    [
        ("red+flower.jpg", "red flower.jpg"),  # S3-STRUCT
        ("this+im+%2B+age+blah.txt", "this im + age blah.txt"),  # aws/aws-sdk-net#640
        (
            "test%2F10%3A47%3A07.20151213-1450022300.log.bz2",
            "test/10:47:07.20151213-1450022300.log.bz2",
        ),
        ("gcs-export/ds%3D2023-12-12/part", "gcs-export/ds=2023-12-12/part"),
        ("a%40b", "a@b"),
        ("100%25+done%3d", "100% done="),
        ("glacier%2Dtest.txt", "glacier-test.txt"),
    ],
)
def test_keys_are_form_decoded(encoded: str, key: str) -> None:
    assert only(with_s3_record(fixture("doc-put.json"), key=encoded)).key == key


def test_unicode_key_from_a_real_sample() -> None:
    event = only({"Records": fixture("e2u-unicode-key-records.json")})
    assert event.key == "你家娃🐱.png"
    assert event.version_id is None  # "" is a Go zero value, not a version
    assert event.sequencer == "xxxxx"


def test_key_that_is_not_utf8_is_malformed() -> None:
    assert_malformed(
        SOURCE, with_s3_record(fixture("doc-put.json"), key="bad%FF"), "percent-encoded UTF-8"
    )


def test_sdk_sample_with_non_hex_sequencer() -> None:
    event = only(fixture("aws-lambda-go-s3-event.json"))
    assert event.sequencer == "Happy Sequencer"
    assert event.time == datetime(1970, 1, 1, 0, 0, 0, 123000, tzinfo=UTC)


# --- ids across wrappers -------------------------------------------------------------------


def test_same_change_in_every_wrapper_gets_one_id() -> None:
    s3_json = sns_message("kafka-bind-sns-put.json")
    wrappers = [
        fixture("kafka-bind-sns-put.json"),  # SNS -> SQS, raw delivery off (real envelope)
        s3_json,  # S3 -> SQS, or SNS raw delivery on
        sns_envelope(s3_json, "another-message-id"),  # the same change, redelivered by SNS
        lambda_sns_event(s3_json),  # SNS -> Lambda
        {"Records": [{"eventSource": "aws:sqs", "messageId": "m1", "body": json.dumps(s3_json)}]},
        {
            "Records": [
                {
                    "eventSource": "aws:sqs",
                    "messageId": "m2",
                    "body": json.dumps(fixture("kafka-bind-sns-put.json")),
                }
            ]
        },
    ]
    events = [only(body) for body in wrappers]
    assert {e.id for e in events} == {events[0].id}
    assert {e.model_dump_json() for e in events} == {events[0].model_dump_json()}
    assert events[0].id == derived_id(
        "s3", "ObjectCreated:Put", "bucket-name", "1.2.3.4-1514864593.00", "005A934FE6C0A58C72"
    )


def test_lambda_sqs_event_fixture_matches_its_body() -> None:
    event = fixture("powertools-sqs-event.json")
    bare = json.loads(event["Records"][0]["body"])
    assert only(event) == only(bare)
    assert only(bare).version_id == "yd3d4HaWOT2zguDLvIQLU6ptDTwKBnQV"


def test_id_without_sequencer_uses_version_time_and_etag() -> None:
    body = with_s3_record(fixture("doc-put.json"), sequencer=None)
    event = only(body)
    assert event.sequencer is None
    assert event.id == derived_id(
        "s3",
        "ObjectCreated:Put",
        "mybucket",
        "HappyFace.jpg",
        "096fKKXTRTtl3on89fVO.nfljtsv6qko",
        "1970-01-01T00:00:00.000Z",
        "d41d8cd98f00b204e9800998ecf8427e",
    )


def test_id_without_any_marker_hashes_the_record() -> None:
    body = with_s3_record(
        fixture("doc-put.json"), sequencer=None, versionId=None, eTag=None, eventTime=None
    )
    event = only(body)
    assert event.time is None
    assert event.id == record_hash_id("s3", body["Records"][0])


def test_quoted_etag_loses_one_pair_of_quotes() -> None:
    assert only(with_s3_record(fixture("doc-put.json"), eTag='"abc"')).etag == "abc"
    assert only(with_s3_record(fixture("doc-put.json"), eTag='""abc""')).etag == '"abc"'


def test_registry_finds_the_module() -> None:
    body = json.dumps(fixture("doc-put.json")).encode()
    assert registry_normalize(Delivery(source="s3", body=body)) == run(fixture("doc-put.json"))


# --- malformed input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"<xml/>", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'"Records"', "not a JSON object"),
        (b"{}", "no Records"),
        (b'{"Records": {}}', "Records is not a JSON array"),
        (b'{"Records": [1]}', r"Records\[0\] is not a JSON object"),
        (b'{"Records": [{"s3": {}}]}', r"Records\[0\]\.eventName is missing"),
        (b'{"Records": [{"eventName": "ObjectCreated:Put"}]}', r"Records\[0\]\.s3 is not"),
        (
            b'{"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "b"},'
            b' "object": {"key": 7}}}]}',
            r"Records\[0\]\.s3\.object\.key is missing or not a string",
        ),
        (
            b'{"Records": [{"eventName": "ObjectCreated:Put",'
            b' "s3": {"bucket": {}, "object": {}}}]}',
            r"Records\[0\]\.s3\.bucket\.name",
        ),
        (b'{"Type": "SubscriptionConfirmation", "Message": "confirm"}', "not a notification"),
        (b'{"Type": "Notification", "Message": "not json"}', "SNS Message is not JSON"),
        (b'{"Type": "Notification", "Message": 5}', "SNS Message is missing or not a string"),
        (b'{"Records": [{"Sns": {"Message": null}}]}', r"Records\[0\]\.Sns\.Message"),
        (b'{"Records": [{"eventSource": "aws:sqs", "body": {}}]}', r"Records\[0\]\.body"),
        (b'{"Records": [{"eventSource": "minio:s3", "eventName": "x"}]}', "not one of"),
        (
            b'{"Records": [{"eventName": "ObjectCreated:Put", "s3": {}}], "x": "\\ud800"}',
            "surrogate",
        ),
    ],
)
def test_malformed_bodies_say_why(body: bytes, message: str) -> None:
    assert_malformed(SOURCE, body, message)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("size", "big", "size is not an integer"),
        ("size", "²", "size is not an integer"),
        ("size", "9" * 5000, "size is not an integer"),
        ("sequencer", 12, "sequencer is not a string"),
        ("versionId", ["v"], "versionId is not a string"),
        ("eTag", {}, "eTag is not a string"),
        ("eventTime", "yesterday", "not an RFC 3339 time"),
        ("eventTime", "0001-01-01T00:00:00+01:00", "out of range"),
        ("eventSource", 3, "eventSource is not a string"),
    ],
)
def test_wrong_field_types_are_malformed(field: str, value: Any, message: str) -> None:
    assert_malformed(SOURCE, with_s3_record(fixture("doc-put.json"), **{field: value}), message)


def test_envelopes_nested_too_deep_are_malformed() -> None:
    body: Any = fixture("doc-put.json")
    for _ in range(4):
        body = sns_envelope(body)
    assert_malformed(SOURCE, body, "nested envelopes")


# --- only what SNS signed (issue 13) -------------------------------------------------------

FOREIGN = [
    {
        "eventSource": "aws:s3",
        "eventName": "ObjectRemoved:Delete",
        "s3": {"bucket": {"name": "uploads"}, "object": {"key": "tenant-b/payroll.xlsx"}},
    }
]


@pytest.mark.parametrize(
    "extra",
    [
        {"Records": FOREIGN},
        {"Records": []},
        {"Event": "s3:TestEvent"},
        {"records": FOREIGN},
        {"Token": "a-confirmation-field"},
        {"x": 1},
    ],
)
def test_signed_envelope_carrying_more_than_sns_sends_is_malformed(extra: Any) -> None:
    envelope = fixture("kafka-bind-sns-put.json")  # a real SNS envelope
    assert len(run(envelope)) == 1
    name = next(iter(extra))
    assert_malformed(SOURCE, {**envelope, **extra}, f"fields SNS does not send.*'{name}'")


@pytest.mark.parametrize(
    "body",
    [
        {"Type": "Notification", "Records": FOREIGN},  # an envelope without its Message
        {"TopicArn": "arn:aws:sns:us-west-2:123456789012:t", "Records": FOREIGN},
        {"Signature": "c2ln", "Records": FOREIGN},
        {"Message": json.dumps({"Records": []}), "Records": FOREIGN},
    ],
)
def test_records_beside_any_sns_field_are_malformed(body: Any) -> None:
    # Decided by the SNS fields before Records is looked at: never read as bare S3 JSON.
    assert_malformed(SOURCE, body, "SNS")


def test_an_envelope_naming_a_field_twice_is_malformed_as_the_bridge_refuses_it() -> None:
    """Issue 23 #10: the bridge refuses an SNS message naming a field twice (401
    `unsigned-fields`); the worker read the last `Message`, which SNS never signed."""
    envelope = fixture("kafka-bind-sns-put.json")
    signed = json.dumps(envelope)
    forged_s3 = dict(sns_message("kafka-bind-sns-put.json"))
    forged_s3["Records"] = [
        {**forged_s3["Records"][0], "eventName": "ObjectRemoved:DeleteMarkerCreated"}
    ]
    # The signed Message first (what a verifier keeping the first reads), a forged one last.
    twice = signed[:-1] + ', "Message": ' + json.dumps(json.dumps(forged_s3)) + "}"
    assert_malformed(SOURCE, twice.encode(), "SNS message names a field twice")
    nested = signed[:-1] + ', "MessageAttributes": {"a": {"Type": "S", "Type": "B"}}}'
    assert_malformed(SOURCE, nested.encode(), "SNS message names a field twice")
    # A bare S3 body is not an envelope: parsed once, as before.
    assert len(run(forged_s3)) == 1


def test_envelope_with_message_attributes_is_read() -> None:
    envelope = {**fixture("kafka-bind-sns-put.json"), "MessageAttributes": {"a": {"Type": "S"}}}
    assert run(envelope) == run(fixture("kafka-bind-sns-put.json"))


def test_lambda_sns_record_carrying_more_than_lambda_sends_is_malformed() -> None:
    s3_json = sns_message("kafka-bind-sns-put.json")
    event = lambda_sns_event(s3_json)
    assert len(run(event)) == 1
    with_records = json.loads(json.dumps(event))
    with_records["Records"][0]["Sns"]["Records"] = FOREIGN
    assert_malformed(SOURCE, with_records, r"Records\[0\]\.Sns envelope carries.*'Records'")
    with_s3 = json.loads(json.dumps(event))
    with_s3["Records"][0].update(FOREIGN[0])
    assert_malformed(SOURCE, with_s3, r"Records\[0\] wraps an SNS message and also carries")
    mixed = {"Records": [event["Records"][0], FOREIGN[0]]}
    assert_malformed(SOURCE, mixed, r"Records\[1\]: Records mixes wrapped messages")
    mixed_sqs = {"Records": [FOREIGN[0], {"eventSource": "aws:sqs", "body": json.dumps(s3_json)}]}
    assert_malformed(SOURCE, mixed_sqs, "mixes wrapped messages")


@settings(max_examples=200)
@given(
    st.text(min_size=1, max_size=20).filter(lambda name: name not in SNS_NOTIFICATION_FIELDS),
    st.deferred(lambda: json_values),
)
def test_any_unsigned_field_on_an_envelope_is_malformed(name: str, value: Any) -> None:
    envelope = {**fixture("kafka-bind-sns-put.json"), name: value}
    assert outcome(SOURCE, envelope) == "malformed"


# --- properties ----------------------------------------------------------------------------

json_values = json_strategy(max_text=None, max_key=12, max_leaves=20)
field_names = st.sampled_from(
    ["eventName", "eventTime", "eventSource", "key", "size", "eTag", "versionId", "sequencer"]
)


@settings(max_examples=300)
@given(st.binary())
def test_arbitrary_bytes_never_escape(body: bytes) -> None:
    assert_only_malformed_and_deterministic(SOURCE, body)


@settings(max_examples=300)
@given(json_values)
def test_arbitrary_json_never_escapes(value: Any) -> None:
    assert_only_malformed_and_deterministic(SOURCE, value)
    assert_only_malformed_and_deterministic(SOURCE, {"Records": [value]})
    assert_only_malformed_and_deterministic(
        SOURCE, {"Type": "Notification", "Message": json.dumps(value)}
    )


@settings(max_examples=300)
@given(st.lists(st.tuples(field_names, json_values), max_size=4), st.booleans())
def test_mutated_real_records_never_escape(changes: list[tuple[str, Any]], wrap: bool) -> None:
    body = fixture("doc-put.json")
    for name, value in changes:
        body = with_s3_record(body, **{name: value if value is not None else 0})
    assert_only_malformed_and_deterministic(SOURCE, sns_envelope(body) if wrap else body)
