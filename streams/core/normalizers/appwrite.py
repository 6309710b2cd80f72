"""Appwrite webhooks (storage file events) -> canonical file events.

Format: `appwrite/appwrite` `src/Appwrite/Platform/Workers/Webhooks.php` (the body is the
event payload, `json_encode`d; headers `X-Appwrite-Webhook-Events`, `-Id`, `-Name`,
`-User-Id`, `-Project-Id`, `-Signature`), the File model
(`src/Appwrite/Utopia/Response/Model/File.php`, https://appwrite.io/docs/models/file) and the
e2e assertions in `tests/e2e/Services/Webhooks/WebhooksBase.php`. Signatures are checked by the
HTTP bridge, not here.

The body has no event name: the kind comes from the `x-appwrite-webhook-events` header, the
comma-separated list of every pattern the event matches. For a file event that list always
holds the all-wildcard form `buckets.*.files.*.<action>` (Appwrite >= 1.0 event names),
which is read instead of splitting ids apart (ids may contain dots).

Kinds:
* `buckets.*.files.*.create` -> `created`.
* `buckets.*.files.*.delete` -> `deleted`, version_only False (Appwrite keeps no versions:
  the file is gone). The body is the deleted file document.
* Dropped on purpose: `buckets.*.files.*.update` (file contents are immutable; an update
  changes only name or permissions), and every delivery whose header names no file event
  (bucket, user, database, function events reaching this route).

Id (PROVIDERS §11 #8): Appwrite sends no event or delivery id, and `x-appwrite-webhook-id`
names the webhook configuration, constant for every delivery, so it is never used.
`derived_id("appwrite", action, bucketId, $id, $updatedAt)`: `$updatedAt` marks the write
(a file deleted and created again under the same custom `$id` gets a new one; the content
MD5 would not tell a re-upload of the same bytes apart). Without it,
`derived_id(..., None, $createdAt on create, signature)`; else `record_hash_id` of the body.

Key (§11 #9): `$id`, the download handle (`/storage/buckets/{bucketId}/files/{fileId}`).
The `name` and the newer display path `key` stay in raw. Bucket: `bucketId`.

Fields: size = `sizeOriginal`; etag = `signature` (the content MD5); version_id None.
time (§11 #12): Appwrite has no event time. On create, `$createdAt` (the document's creation
is this event); on delete None (`$updatedAt` of the deleted document is its last write, not
the delete). Appwrite before 1.0 sent these as Unix seconds; both forms are read. sequencer
None. raw = the body (the File document).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from streams.core.delivery import Delivery
from streams.core.event import EventType, FileEvent
from streams.core.normalizers.base import (
    MalformedDelivery,
    change_id,
    load_json,
    optional_int,
    parse_time,
    present,
    require_dict,
    require_str,
)

SOURCE = "appwrite"

_EVENTS_HEADER = "x-appwrite-webhook-events"

_ACTIONS: dict[str, EventType | None] = {
    "create": "created",
    "delete": "deleted",
    "update": None,  # metadata only: dropped
}


def normalize(delivery: Delivery) -> list[FileEvent]:
    document = require_dict(load_json(delivery.body), "body")
    header = delivery.headers.get(_EVENTS_HEADER)
    if not isinstance(header, str) or not header.strip():
        raise MalformedDelivery(f"{_EVENTS_HEADER} header is missing: the body names no event")
    names = {name.strip() for name in header.split(",")}
    actions = [action for action in _ACTIONS if f"buckets.*.files.*.{action}" in names]
    if not actions:
        return []  # not a storage file event
    if len(actions) > 1:
        raise MalformedDelivery(f"{_EVENTS_HEADER} names several file actions: {actions}")
    action = actions[0]
    event_type = _ACTIONS[action]
    if event_type is None:
        return []

    key = require_str(document.get("$id"), "$id")
    bucket = require_str(document.get("bucketId"), "bucketId")
    etag = present(document.get("signature"), "signature")
    created = _document_time(document.get("$createdAt"), "$createdAt")
    time = created if event_type == "created" else None
    return [
        FileEvent(
            id=_event_id(document, action, bucket, key, time, etag),
            type=event_type,
            key=key,
            bucket=bucket,
            size=optional_int(document.get("sizeOriginal"), "sizeOriginal"),
            etag=etag,
            time=time,
            provider=SOURCE,
            version_only=False if event_type == "deleted" else None,
            raw=document,
        )
    ]


def _event_id(
    document: dict[str, Any],
    action: str,
    bucket: str,
    key: str,
    time: datetime | None,
    etag: str | None,
) -> str:
    updated = document.get("$updatedAt")
    if updated == "":
        updated = None
    if updated is not None and (isinstance(updated, bool) or not isinstance(updated, str | int)):
        raise MalformedDelivery(f"$updatedAt is not a time: {updated!r}")
    # $updatedAt, verbatim, marks the write as a version would.
    return change_id(SOURCE, action, bucket, key, updated, time, etag, document)


def _document_time(value: Any, what: str) -> datetime | None:
    """ISO 8601 (Appwrite >= 1.0) or Unix seconds (older servers), as UTC."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, tz=UTC)
        except (OverflowError, OSError, ValueError):
            raise MalformedDelivery(f"{what} is out of range: {value!r}") from None
    return parse_time(value, what)
