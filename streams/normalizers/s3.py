"""Amazon S3 event notifications (via SQS, SNS or Lambda) -> canonical events.

Format
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/notification-content-structure.html
    (mirror `awsdocs/amazon-s3-userguide:doc_source/notification-content-structure.md`),
    event kinds: `doc_source/notification-how-to-event-types-and-destinations.md`, lifecycle:
    `doc_source/lifecycle-configure-notification.md`; SDK test data
    `aws/aws-lambda-go:events/testdata/s3-event.json`,
    `aws-powertools/powertools-lambda-python:tests/events/s3Event.json`.

Accepted bodies (nested at most three deep, so every wrapper of one change gives one id)
    * the S3 JSON `{"Records": [...]}` (S3 -> SQS, or SNS raw delivery);
    * an SNS envelope `{"Type": "Notification", "Message": "<S3 JSON>"}` (SNS -> SQS/HTTP);
      other SNS types (subscription confirmations) are MalformedDelivery: the bridge owns them;
    * Lambda events whose records wrap one: `Records[].Sns.Message` (SNS) or
      `Records[].body` with `eventSource` `aws:sqs` (SQS).

Kinds (record `eventName`; an `s3:` prefix, as in some SDK test data and S3-compatible
servers, is tolerated)
    * created: `ObjectCreated:*` (Put, Post, Copy, CompleteMultipartUpload, future ones);
    * deleted: `ObjectRemoved:Delete`, `ObjectRemoved:DeleteMarkerCreated`,
      `LifecycleExpiration:Delete`, `LifecycleExpiration:DeleteMarkerCreated`;
    * dropped on purpose (no content change): restore, replication, tagging, ACL, lifecycle
      transition, Intelligent-Tiering, `ReducedRedundancyLostObject`, unknown kinds;
    * `s3:TestEvent` (sent when a configuration is saved): no events (§11 #19: dropped and
      counted by the stream, not dead-lettered; lifecycle expirations are deletions).

Id: S3 has no event id. `derived_id(provider, eventName, bucket, key, sequencer)`: duplicates
share the sequencer. Without one: `derived_id(provider, eventName, bucket, key, versionId,
eventTime, eTag)`; with none of those either: `record_hash_id(provider, record)`. Transport
ids (SQS/SNS MessageId, x-amz-request-id) are never used. `key` in the id is the decoded key.

Key: form-encoded (`red+flower.jpg`): `+` is a space, then %XX is UTF-8 (`form_decode`).

Fields: `version_only` is True for `*:Delete` carrying a versionId (one version went; the key
may live on), False for unversioned deletes and delete markers. `versionId` `"null"` stays
`"null"` (§11 #16) and counts as a version. Go zero values (`""`, seen in SDK-marshalled
samples) count as absent. One pair of quotes is stripped from eTags (§11 #15); size/eTag on
deletes are passed through as given (S3 sends none, §11 #14). `time` is `eventTime` in UTC.

The record parsing here is shared by `minio` (same record shape, its own kinds); the value
helpers (`present`, `strip_quotes`, `optional_int`, `parse_time`, `load_json`) are `base`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from streams.delivery import Delivery
from streams.event import FileEvent
from streams.normalizers.base import (
    MalformedDelivery,
    derived_id,
    load_json,
    optional_int,
    optional_str,
    parse_time,
    present,
    record_hash_id,
    require_dict,
    require_str,
    strip_quotes,
)
from streams.normalizers.keys import form_decode

SOURCE = "s3"

Kind = Literal["created", "deleted", "version_delete"]
"""created; deleted (the live object is gone); version_delete (one version went, if the
record names one, else the live object is gone)."""

Classify = Callable[[str], Kind | None]

_MAX_NESTING = 3
_DELETE_MARKERS = {"ObjectRemoved:DeleteMarkerCreated", "LifecycleExpiration:DeleteMarkerCreated"}
_VERSION_DELETES = {"ObjectRemoved:Delete", "LifecycleExpiration:Delete"}


def normalize(delivery: Delivery) -> list[FileEvent]:
    """Every created/deleted event in one S3 notification delivery, in record order."""
    return _events(load_json(delivery.body), 0)


def classify(event_name: str) -> Kind | None:
    """AWS's kind for a record `eventName`; None drops it."""
    name = event_name.removeprefix("s3:")
    if name.startswith("ObjectCreated:"):
        return "created"
    if name in _VERSION_DELETES:
        return "version_delete"
    if name in _DELETE_MARKERS:
        return "deleted"
    return None


def _events(body: Any, depth: int) -> list[FileEvent]:
    if not isinstance(body, dict):
        raise MalformedDelivery("S3 notification is not a JSON object")
    if "Records" not in body:
        return _unwrapped(body, depth)
    records = body["Records"]
    if not isinstance(records, list):
        raise MalformedDelivery("Records is not a JSON array")
    events: list[FileEvent] = []
    for index, record in enumerate(records):
        what = f"Records[{index}]"
        inner = _wrapped_message(record, what)
        if inner is None:
            events.extend(record_events(record, what, SOURCE, classify, {"aws:s3"}))
        else:
            events.extend(_events(_nested(inner, what, depth), depth + 1))
    return events


def _unwrapped(body: dict[str, Any], depth: int) -> list[FileEvent]:
    """A body without Records: an SNS envelope, the test event, or garbage."""
    if body.get("Event") == "s3:TestEvent":
        return []  # sent once when a notification configuration is saved
    if "Type" in body and "Message" in body:
        if body["Type"] != "Notification":
            raise MalformedDelivery(f"SNS message of Type {body['Type']!r} is not a notification")
        message = require_str(body["Message"], "SNS Message")
        return _events(_nested(message, "SNS Message", depth), depth + 1)
    raise MalformedDelivery("S3 notification has no Records (and is no SNS envelope)")


def _wrapped_message(record: Any, what: str) -> str | None:
    """The S3 JSON a Lambda SNS/SQS record carries, or None for a plain S3 record."""
    if not isinstance(record, dict):
        raise MalformedDelivery(f"{what} is not a JSON object")
    if "Sns" in record:
        sns = require_dict(record["Sns"], f"{what}.Sns")
        return require_str(sns.get("Message"), f"{what}.Sns.Message")
    if record.get("eventSource") == "aws:sqs":
        return require_str(record.get("body"), f"{what}.body")
    return None


def _nested(text: str, what: str, depth: int) -> Any:
    if depth >= _MAX_NESTING:
        raise MalformedDelivery(f"{what}: more than {_MAX_NESTING} nested envelopes")
    return load_json(text, what)


def record_events(
    record: Any,
    what: str,
    provider: str,
    kind_of: Classify,
    event_sources: set[str],
    placeholder_versions: frozenset[str] = frozenset(),
) -> list[FileEvent]:
    """The event (zero or one) for one S3-shaped record.

    `placeholder_versions` are versionId values that name no version (MinIO's legacy "1").
    """
    record = require_dict(record, what)
    source = optional_str(record.get("eventSource"), f"{what}.eventSource")
    if source is not None and source not in event_sources:
        # Another provider's record: this delivery was routed to the wrong source.
        raise MalformedDelivery(
            f"{what}.eventSource {source!r} is not one of {sorted(event_sources)}"
        )
    name = require_str(record.get("eventName"), f"{what}.eventName")
    kind = kind_of(name)
    if kind is None:
        return []  # dropped before reading the object: bucket/metadata events lack one
    s3 = require_dict(record.get("s3"), f"{what}.s3")
    bucket_info = require_dict(s3.get("bucket"), f"{what}.s3.bucket")
    bucket = require_str(bucket_info.get("name"), f"{what}.s3.bucket.name")
    obj = require_dict(s3.get("object"), f"{what}.s3.object")
    key = form_decode(require_str(obj.get("key"), f"{what}.s3.object.key"))
    sequencer = present(obj.get("sequencer"), f"{what}.s3.object.sequencer")
    version = present(obj.get("versionId"), f"{what}.s3.object.versionId")
    if version in placeholder_versions:
        version = None
    event_time = present(record.get("eventTime"), f"{what}.eventTime")
    raw_etag = present(obj.get("eTag"), f"{what}.s3.object.eTag")
    if sequencer is not None:
        event_id = derived_id(provider, name, bucket, key, sequencer)
    elif version is not None or event_time is not None or raw_etag is not None:
        event_id = derived_id(provider, name, bucket, key, version, event_time, raw_etag)
    else:
        event_id = record_hash_id(provider, record)
    version_only = None if kind == "created" else kind == "version_delete" and version is not None
    return [
        FileEvent(
            id=event_id,
            type="created" if kind == "created" else "deleted",
            key=key,
            bucket=bucket,
            size=optional_int(obj.get("size"), f"{what}.s3.object.size"),
            etag=strip_quotes(raw_etag),
            version_id=version,
            time=parse_time(event_time, f"{what}.eventTime"),
            sequencer=sequencer,
            provider=provider,
            version_only=version_only,
            raw=record,
        )
    ]
