"""Amazon S3 events delivered by Amazon EventBridge -> canonical events.

Format
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/ev-events.html
    (mirror `awsdocs/amazon-s3-userguide:doc_source/ev-events.md`); real events in
    `aws-powertools/powertools-lambda-python:tests/events/s3EventBridgeNotification*.json`,
    `localstack/localstack:tests/aws/services/s3/test_s3_notifications_eventbridge.snapshot.json`
    (recorded against AWS, values masked).

Accepted bodies: one EventBridge event, as an SQS target, Lambda, or API destination receives
it; or that event inside an SNS `Notification` envelope (SNS target without raw delivery).
Only `source` `aws.s3` is accepted: any other source is MalformedDelivery (a routing error).

Kinds (`detail-type`)
    * created: `Object Created` (PutObject, POST Object, CopyObject, CompleteMultipartUpload);
    * deleted: `Object Deleted` (DeleteObject or Lifecycle Expiration);
    * dropped on purpose (no content change): Object Restore Initiated/Completed/Expired,
      Object Tags Added/Deleted, Object ACL Updated, Object Storage Class Changed,
      Object Access Tier Changed, and any other detail-type.

Id: the event's `id` (a UUID per event), exactly; replays and redeliveries keep it.

Key: `detail.object.key` verbatim. EventBridge keys are not form-encoded (the one real capture
with special characters has literal spaces), and decoding would corrupt `+` and `%`.

Fields: `detail.bucket.name`; `size`; `etag` (moto's emulator spells it `eTag`: accepted too),
one pair of quotes stripped; `version-id` verbatim (`"null"` stays); `sequencer` verbatim
(small-letter hex in doc examples, capitals in real events: comparison is not done here);
`time` is the top-level `time` (whole seconds). `version_only` on deletes: `deletion-type`
`Delete Marker Created` -> False; `Permanently Deleted` -> True with a `version-id` (one
version went), False without (an unversioned delete); no `deletion-type` -> None (not told).
`raw` is the whole event.
"""

from __future__ import annotations

from typing import Any

from streams.core.delivery import Delivery
from streams.core.event import EventType, FileEvent
from streams.core.normalizers.base import (
    MalformedDelivery,
    load_json,
    optional_int,
    parse_time,
    present,
    require_dict,
    require_str,
    strip_quotes,
)

SOURCE = "eventbridge"

_TYPES: dict[str, EventType] = {"Object Created": "created", "Object Deleted": "deleted"}


def normalize(delivery: Delivery) -> list[FileEvent]:
    """The created/deleted event in one EventBridge delivery (zero or one)."""
    event = _unwrap_sns(require_dict(load_json(delivery.body), "EventBridge event"))
    source = event.get("source")
    if source != "aws.s3":
        raise MalformedDelivery(f"EventBridge source {source!r} is not 'aws.s3'")
    event_type = _TYPES.get(require_str(event.get("detail-type"), "detail-type"))
    if event_type is None:
        return []  # restore, tagging, ACL, storage class: no content change
    event_id = require_str(event.get("id"), "id")
    detail = require_dict(event.get("detail"), "detail")
    bucket = require_dict(detail.get("bucket"), "detail.bucket")
    obj = require_dict(detail.get("object"), "detail.object")
    version = present(obj.get("version-id"), "detail.object.version-id")
    etag = obj.get("etag", obj.get("eTag"))
    # Every value below is already of its field's exact type (read from JSON, or made
    # here), the time in UTC, and the event object is this event's own: FileEvent's
    # validation would only repeat the checks.
    return [
        FileEvent.from_checked(
            id=event_id,
            type=event_type,
            key=require_str(obj.get("key"), "detail.object.key"),
            bucket=require_str(bucket.get("name"), "detail.bucket.name"),
            size=optional_int(obj.get("size"), "detail.object.size"),
            etag=strip_quotes(present(etag, "detail.object.etag")),
            version_id=version,
            time=parse_time(event.get("time"), "time"),
            sequencer=present(obj.get("sequencer"), "detail.object.sequencer"),
            provider=SOURCE,
            version_only=_version_only(event_type, detail, version),
            raw=event,
        )
    ]


def _unwrap_sns(body: dict[str, Any]) -> dict[str, Any]:
    """The event inside an SNS Notification envelope, or the body itself."""
    if "source" in body or "Message" not in body or "Type" not in body:
        return body
    if body["Type"] != "Notification":
        raise MalformedDelivery(f"SNS message of Type {body['Type']!r} is not a notification")
    message = require_str(body["Message"], "SNS Message")
    return require_dict(load_json(message, "SNS Message"), "SNS Message")


def _version_only(
    event_type: EventType, detail: dict[str, Any], version: str | None
) -> bool | None:
    if event_type == "created":
        return None
    deletion = detail.get("deletion-type")
    if deletion == "Delete Marker Created":
        return False
    if deletion == "Permanently Deleted":
        return version is not None
    return None  # absent or unknown: EventBridge does not tell
