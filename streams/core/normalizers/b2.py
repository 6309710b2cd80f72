"""Backblaze B2 Event Notifications (webhook) -> canonical file events.

Format: https://www.backblaze.com/docs/cloud-storage-event-notifications-reference-guide and
`Backblaze/b2-sdk-java` (`B2EventNotification`, `B2EventNotificationEvent` and their tests);
real deliveries in `backblaze-b2-samples/b2listen` README. The body is `{"events": [...]}`,
1-50 events per POST; each becomes its own canonical event, in order.

Kinds (`eventType`; the family decides, so a new sub-kind of a known family still maps):
* `b2:ObjectCreated:*` (Upload, MultipartUpload, Copy, Replica, MultipartReplica) -> `created`.
* `b2:ObjectDeleted:*` (Delete, LifecycleRule) -> `deleted`, version_only True: one file
  version was removed and the name may still be live (PROVIDERS §12.6).
* `b2:HideMarkerCreated:*` (Hide, LifecycleRule) -> `deleted`, version_only False: the name
  is hidden, which is what an S3-API delete does; the key is gone.
* Dropped on purpose: `b2:MultipartUploadCreated:*` (an upload started; nothing readable yet)
  and `b2:TestEvent` (no object fields).
* Any other family is malformed (dead-lettered) rather than silently skipped: it carries an
  object name and might be a change we would otherwise lose.

Id: `eventId`, exactly (64 hex characters in real deliveries; unique per event, so two uploads
of one name differ). Without one (SDK test data has none):
`derived_id("b2", eventType, bucketName, objectName, objectVersionId)`; without a version id,
`derived_id(..., None, eventTimestamp, None)`; else `record_hash_id` of the event.

Key: `objectName` verbatim (B2 sends names raw). Bucket: `bucketName` (`bucketId` is in raw).

Fields: version_id = `objectVersionId` (the B2 file id). size = `objectSize` as given, also on
`ObjectDeleted` (§11 #20: the deleted version's size is the provider's statement), but None on
`HideMarkerCreated`, where the reported size (0 per a reference-guide quote) is the hide
marker's, not the hidden file's. etag: B2 sends none, so None. time = `eventTimestamp` (epoch
milliseconds, UTC). sequencer None (B2 has no per-key ordering token). raw = the event object.
Signatures (`x-bz-event-notification-signature`) are checked by the HTTP bridge, not here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from streams.core.delivery import Delivery
from streams.core.event import EventType, FileEvent
from streams.core.normalizers.base import (
    MalformedDelivery,
    change_id,
    load_json,
    optional_int,
    optional_str,
    parse_epoch_millis,
    present,
    require_dict,
    require_str,
)

SOURCE = "b2"

# Event family prefix -> (canonical type, version_only).
_MAPPED: dict[str, tuple[EventType, bool | None]] = {
    "b2:ObjectCreated:": ("created", None),
    "b2:ObjectDeleted:": ("deleted", True),
    "b2:HideMarkerCreated:": ("deleted", False),
}
_DROPPED_PREFIXES = ("b2:MultipartUploadCreated:",)
_DROPPED = frozenset({"b2:TestEvent"})


def normalize(delivery: Delivery) -> list[FileEvent]:
    notification = require_dict(load_json(delivery.body), "body")
    records = notification.get("events")
    if not isinstance(records, list):
        raise MalformedDelivery("events is missing or not a list")
    events: list[FileEvent] = []
    for index, record in enumerate(records):
        event = _event(require_dict(record, f"events[{index}]"), f"events[{index}]")
        if event is not None:
            events.append(event)
    return events


def _event(record: dict[str, Any], where: str) -> FileEvent | None:
    kind = require_str(record.get("eventType"), f"{where}.eventType")
    if kind in _DROPPED or kind.startswith(_DROPPED_PREFIXES):
        return None
    mapped = next((m for prefix, m in _MAPPED.items() if kind.startswith(prefix)), None)
    if mapped is None:
        raise MalformedDelivery(f"{where}.eventType {kind!r} is not a known B2 event type")
    event_type, version_only = mapped

    bucket = require_str(record.get("bucketName"), f"{where}.bucketName")
    key = require_str(record.get("objectName"), f"{where}.objectName")
    version = present(record.get("objectVersionId"), f"{where}.objectVersionId")
    size = optional_int(record.get("objectSize"), f"{where}.objectSize")
    if kind.startswith("b2:HideMarkerCreated:"):
        size = None  # the hide marker's own size, not the hidden file's
    time = parse_epoch_millis(record.get("eventTimestamp"), f"{where}.eventTimestamp")

    return FileEvent(
        id=_event_id(record, where, kind, bucket, key, version, time),
        type=event_type,
        key=key,
        bucket=bucket,
        size=size,
        etag=None,
        version_id=version,
        time=time,
        provider=SOURCE,
        version_only=version_only,
        raw=record,
    )


def _event_id(
    record: dict[str, Any],
    where: str,
    kind: str,
    bucket: str,
    key: str,
    version: str | None,
    time: datetime | None,
) -> str:
    event_id = optional_str(record.get("eventId"), f"{where}.eventId")
    if event_id:
        return event_id
    return change_id(SOURCE, kind, bucket, key, version, time, None, record)  # B2 has no etag
