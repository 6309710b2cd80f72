"""Cloudinary webhook notifications -> canonical file events.

Format: https://cloudinary.com/documentation/notifications (`notification_type`, upload and
delete payloads); real captures in `jackdbd/webhooks` `assets/webhook-events/cloudinary/`
(2022-2023); the rename fields (`from_public_id`, `to_public_id`) from the same page and the
third-party AsyncAPI description `api-evangelist/cloudinary`. Signatures (`x-cld-signature`,
`x-cld-timestamp`) are checked by the HTTP bridge, not here.

Kinds (`notification_type`):
* `upload` -> `created` (a new asset, or a new version when it overwrites a public id).
* `delete` -> one `deleted` per `resources[]` entry, in order, version_only False (the asset
  is gone; Cloudinary has no noncurrent versions to fall back on).
* `rename` (PROVIDERS §11 #11) -> `deleted` (from) + `created` (to), ids `f"{id}:deleted"` /
  `f"{id}:created"`: under a key built from the public id the old key really goes away. The
  payload has no size or etag, so the `created` half carries None for both.
* Dropped on purpose, as they change no asset content under its key: `eager`, `moderation`,
  `resource_tags_changed`, `resource_context_changed`, `resource_metadata_changed`,
  `resource_display_name_changed`, `access_control_changed`, `related_assets`, `move` (in
  dynamic-folder accounts it changes `asset_folder`, not the public id), `create_folder`,
  `delete_folder`, `move_or_rename_asset_folder`, `multi`, `explode`, `proof_status_changed`,
  and any other type.

Key: `{resource_type}/{type}/{public_id}`, public id verbatim (it may contain `/` folders,
spaces, `+`, `%`; image and video ids have no extension). An asset is identified by all three
(an image and a video may share a public id), this is the path the Admin API takes
(`/resources/{resource_type}/{type}/{public_id}`) and the tail of the delivery URL, and an
instance prefix such as `image/upload/` then keeps exactly one resource and delivery type.
Splitting the key at its first two `/` gives the three parts back. Bucket: None (the cloud
name is only inside `url`).

Id: `request_id`, exactly, on upload (and rename). Deletes carry none (§11 #10; neither real
capture has one, and where a bulk delete had one it would name the whole request, not each
deletion): `derived_id("cloudinary", "delete", None, key, version)` per resource, `version`
being the deleted version's timestamp, so a redelivery repeats the id and a later delete of a
re-uploaded asset does not. Fallbacks: `derived_id(..., None, time, etag)`, then
`record_hash_id` of the record.

Fields: size = `bytes`; etag = `etag` (one pair of quotes stripped if present); version_id =
the provider's `version_id`, the hash naming one stored version (uploads and renames carry it;
delete notifications do not, so None unless a `resources[]` entry has one). `version` (the
version's upload time, Unix seconds) stays in raw and keeps feeding the derived ids above,
which must repeat on redelivery. Ordering uses neither: sequencer None, so streams.core.ordering
compares the event time, which is finer than `version`'s seconds and present on deletes (a
delete's `version` is the deleted version's, no later than its upload's, so it could not order
the two). time (§11 #12) = `notification_context.triggered_at` (when the action happened,
microseconds; present on deletes too), else `timestamp` (when the notification was made), else
None; `created_at` is not used: it is the asset's first creation, not this event.
raw = the notification for upload and rename, the `resources[]` entry for a delete.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from streams.core.delivery import Delivery
from streams.core.event import FileEvent, format_time
from streams.core.normalizers.base import (
    MalformedDelivery,
    change_id,
    derived_id,
    load_json,
    optional_int,
    optional_str,
    parse_time,
    present,
    require_dict,
    require_str,
    strip_quotes,
)

SOURCE = "cloudinary"


def normalize(delivery: Delivery) -> list[FileEvent]:
    notification = require_dict(load_json(delivery.body), "body")
    kind = require_str(notification.get("notification_type"), "notification_type")
    if kind == "upload":
        return [_upload(notification)]
    if kind == "delete":
        return _deletes(notification)
    if kind == "rename":
        return _rename(notification)
    return []  # no content change under a key (see the module docstring)


def _upload(notification: dict[str, Any]) -> FileEvent:
    key = _key(notification, "public_id", "")
    version = _version(notification.get("version"), "version")
    etag = strip_quotes(optional_str(notification.get("etag"), "etag"))
    time = _event_time(notification)
    event_id = optional_str(notification.get("request_id"), "request_id") or _derived_id(
        "upload", key, version, time, etag, notification
    )
    return FileEvent(
        id=event_id,
        type="created",
        key=key,
        size=optional_int(notification.get("bytes"), "bytes"),
        etag=etag,
        version_id=present(notification.get("version_id"), "version_id"),
        time=time,
        provider=SOURCE,
        raw=notification,
    )


def _deletes(notification: dict[str, Any]) -> list[FileEvent]:
    resources = notification.get("resources")
    if not isinstance(resources, list):
        raise MalformedDelivery("resources is missing or not a list")
    time = _event_time(notification)
    events = []
    for index, item in enumerate(resources):
        where = f"resources[{index}]"
        resource = require_dict(item, where)
        key = _key(resource, "public_id", f"{where}.")
        version = _version(resource.get("version"), f"{where}.version")
        events.append(
            FileEvent(
                id=_derived_id("delete", key, version, time, None, resource),
                type="deleted",
                key=key,
                version_id=present(resource.get("version_id"), f"{where}.version_id"),
                time=time,
                provider=SOURCE,
                version_only=False,
                raw=resource,
            )
        )
    return events


def _rename(notification: dict[str, Any]) -> list[FileEvent]:
    old_key = _key(notification, "from_public_id", "")
    new_key = _key(notification, "to_public_id", "")
    if old_key == new_key:
        return []  # nothing moved
    _version(notification.get("version"), "version")  # malformed as on upload; ids ignore it
    version_id = present(notification.get("version_id"), "version_id")
    time = _event_time(notification)
    stamp = format_time(time) if time is not None else None
    base = optional_str(notification.get("request_id"), "request_id") or derived_id(
        SOURCE, "rename", None, new_key, old_key, stamp
    )
    return [
        FileEvent(
            id=f"{base}:deleted",
            type="deleted",
            key=old_key,
            time=time,
            provider=SOURCE,
            version_only=False,
            raw=notification,
        ),
        FileEvent(
            id=f"{base}:created",
            type="created",
            key=new_key,
            version_id=version_id,
            time=time,
            provider=SOURCE,
            raw=notification,
        ),
    ]


def _key(record: dict[str, Any], id_field: str, where: str) -> str:
    """`{resource_type}/{type}/{public id}`: the asset's full identity, as the Admin API path."""
    resource_type = require_str(record.get("resource_type"), f"{where}resource_type")
    delivery_type = require_str(record.get("type"), f"{where}type")
    public_id = require_str(record.get(id_field), f"{where}{id_field}")
    if "/" in resource_type or "/" in delivery_type:
        # Either would make the key ambiguous to split; Cloudinary's values are plain words.
        raise MalformedDelivery(
            f"{where}resource_type {resource_type!r} or type {delivery_type!r} contains '/'"
        )
    return f"{resource_type}/{delivery_type}/{public_id}"


def _version(value: Any, what: str) -> str | None:
    """The version timestamp (an integer) as a string; None when absent."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return value
    raise MalformedDelivery(f"{what} is not an integer: {value!r}")


def _event_time(notification: dict[str, Any]) -> datetime | None:
    context = notification.get("notification_context")
    if context is None:
        context = {}  # absent in 2021-era notifications
    context = require_dict(context, "notification_context")
    triggered = parse_time(context.get("triggered_at"), "notification_context.triggered_at")
    if triggered is not None:
        return triggered
    return parse_time(notification.get("timestamp"), "timestamp")


def _derived_id(
    kind: str,
    key: str,
    version: str | None,
    time: datetime | None,
    etag: str | None,
    record: dict[str, Any],
) -> str:
    return change_id(SOURCE, kind, None, key, version, time, etag, record)
