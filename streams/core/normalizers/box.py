"""Box V2 webhooks -> canonical file events.

Format: https://developer.box.com/guides/webhooks/v2/ (`box/developer.box.com`
`content/guides/webhooks/v2/index.md`: body `type`, `id`, `created_at`, `trigger`,
`webhook`, `created_by`, `source`) and the trigger list of
https://developer.box.com/reference/resources/webhook-invocation/. FILE.TRASHED bodies carry
only `source: {id, type}` (Box staff in `box/box-python-sdk#764`; a 2025 capture).

Kinds (`trigger`), keyed by the file id (below):
* `FILE.UPLOADED` (a new file, or a new version of one), `FILE.RESTORED` (back from the
  trash), `FILE.COPIED` (PROVIDERS §11 #7: `source` is taken to be the copy, a new file id;
  were it ever the original, the consumer merely sees an existing file announced again)
  -> `created`.
* `FILE.TRASHED` (gone from its folder, restorable) and `FILE.DELETED` (purged; may follow
  TRASHED with its own body id) -> `deleted`, version_only False: the file is no longer live.
* Dropped on purpose: `FILE.RENAMED` and `FILE.MOVED` (the key is the file id, which neither
  changes; the new path is in the next event's raw), `FILE.PREVIEWED`, `FILE.DOWNLOADED`,
  `FILE.LOCKED`, `FILE.UNLOCKED`, and every non-file trigger (`FOLDER.*`, `COMMENT.*`,
  `COLLABORATION.*`, `SHARED_LINK.*`, `METADATA_INSTANCE.*`, `TASK_ASSIGNMENT.*`,
  `SIGN_REQUEST.*`, `WEBHOOK.DELETED`): none changes a file's content. Note that
  `FOLDER.TRASHED` removes every file below it without a per-file event; Box's payload does
  not list them, so only a reconciliation can catch those.

Id: the body `id`, exactly: Box keeps it across retries while `box-delivery-id` (a transport
id, per attempt) changes, so the header is never used. Without a body id (§11 #22; the
`box-python-sdk` signature vector has none): `derived_id("box", trigger, None, source.id,
file_version.id)`; without a version, `derived_id(..., None, created_at, sha1)`; else
`record_hash_id` of the body.

Key (§11 #6): `source.id`, the file id: stable across rename and move, present on every
trigger (trash bodies have no path), and what downloads take (`GET /files/{id}/content`).
The path (`path_collection`, `name`) stays in raw. Bucket: None (Box has no bucket).

Fields: size = `source.size`; etag = `source.sha1` (§11 #7): Box's own `etag` and
`sequence_id` are item revision counters that also move on rename, while `sha1` names the
content, which is what an etag is compared for; both counters stay in raw. version_id =
`source.file_version.id`. time = `created_at` (RFC 3339 with a local offset), as UTC.
sequencer None: `sequence_id` is not shown to be ordered across events, so it stays in raw.
raw = the whole body.
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
    parse_time,
    present,
    require_dict,
    require_str,
)

SOURCE = "box"

_MAPPED: dict[str, EventType] = {
    "FILE.UPLOADED": "created",
    "FILE.RESTORED": "created",
    "FILE.COPIED": "created",
    "FILE.TRASHED": "deleted",
    "FILE.DELETED": "deleted",
}


def normalize(delivery: Delivery) -> list[FileEvent]:
    body = require_dict(load_json(delivery.body), "body")
    if body.get("type", "webhook_event") != "webhook_event":
        raise MalformedDelivery(f"type {body.get('type')!r} is not 'webhook_event'")
    trigger = require_str(body.get("trigger"), "trigger")
    source = require_dict(body.get("source"), "source")
    event_type = _MAPPED.get(trigger)
    if event_type is None:
        return []  # not a change to a file's content (see the module docstring)
    if source.get("type") != "file":
        raise MalformedDelivery(f"{trigger} source.type is {source.get('type')!r}, not 'file'")

    key = require_str(source.get("id"), "source.id")
    file_version = source.get("file_version")
    if file_version is None:
        file_version = {}  # trash bodies carry only id and type
    file_version = require_dict(file_version, "source.file_version")
    version = present(file_version.get("id"), "source.file_version.id")
    etag = present(source.get("sha1"), "source.sha1")
    time = parse_time(body.get("created_at"), "created_at")

    return [
        FileEvent(
            id=_event_id(body, trigger, key, version, time, etag),
            type=event_type,
            key=key,
            bucket=None,
            size=optional_int(source.get("size"), "source.size"),
            etag=etag,
            version_id=version,
            time=time,
            provider=SOURCE,
            version_only=False if event_type == "deleted" else None,
            raw=body,
        )
    ]


def _event_id(
    body: dict[str, Any],
    trigger: str,
    key: str,
    version: str | None,
    time: datetime | None,
    etag: str | None,
) -> str:
    event_id = optional_str(body.get("id"), "id")
    if event_id:
        return event_id
    return change_id(SOURCE, trigger, None, key, version, time, etag, body)
