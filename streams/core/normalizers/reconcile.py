"""Synthetic deliveries of `python -m connectors reconcile` -> canonical events.

Format: defined by this product (`connectors/reconcile/` writes it); one JSON object per
delivery, one change each:

    {"type": "created" | "deleted",
     "bucket": "uploads" | null,           # required; null for providers without buckets
                                           #   (Box, Cloudinary), whose events name none
     "key": "tenant-a/photos/a.jpg",       # required: the full provider key, prefix included,
                                           #   raw (listings are not form-encoded)
     "etag": "9b2cf535f27731c974343645a3985328" | null,
     "size": 1024 | null,
     "last_modified": "2026-11-30T00:08:07Z" | null,
     "observed_at": "2026-11-30T01:00:00.123456Z",
     "id": "reconcile:<32 hex>",           # optional; derived as below when absent
     "instance": "tenant-a",               # the one instance it is for (streams.core.routing)
     "reason": "not-in-stream" | "deleted-in-stream" | "etag-differs" | "not-listed"}

`created`: the listing holds the object and the stream does not (no event for the key, or its
last one is a `deleted`, or a `created` with another ETag); `etag`, `size` and
`last_modified` are the listing's. `deleted`: the stream's last event for the key is a
`created` and the listing does not hold the key; `etag` and `last_modified` describe the
object the stream last knew (its last event's ETag and time), size is null.

Id (the spec's fallback for providers without an event id: the key, the ETag and the
last-modified time): `reconcile_id(type, bucket, key, etag, last_modified)` =
`derived_id("reconcile", type, bucket, key, etag, last_modified in RFC 3339 UTC)`. So two runs
that see the same drift publish the same id (the stream drops the second), while a later
drift of the same key differs in ETag or time. A given `id` is taken as is, and deduped in
reconcile's own scope (streams.core.emitting.id_scope): it never takes a provider event's
dedupe key, whatever it says.

Instance: a reconcile delivery is for the one instance its `instance` names (on a raw topic
that reaches one instance, that one when absent); routing sends it there only
(streams.core.routing.reconcile_instance), so a reconcile credential reaches only the
instances of the raw topics it may write.

Fields: `time` is `observed_at` (else `last_modified`): when the listing that found the drift
started. The provider sent no event for a change that reconcile finds, and ordering per key
compares it by time with the real notifications (when the instance's `sources` names that
one provider: state is scoped by provider, streams.core.emitting.instance_scope): a real event newer
than the listing wins over the synthetic one (which goes to the stale topic), a notification
older than the listing loses to it. `version_only` is False on `deleted` (the live key is gone
from the listing), None on `created`; `version_id` and `sequencer` are None; `etag` is
stripped of one pair of quotes. `raw` is the body.
"""

from __future__ import annotations

from datetime import datetime

from streams.core.delivery import Delivery
from streams.core.event import EventType, FileEvent, format_time
from streams.core.normalizers.base import (
    MalformedDelivery,
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

SOURCE = "reconcile"
TYPES: tuple[EventType, ...] = ("created", "deleted")


def reconcile_id(
    event_type: str, bucket: str | None, key: str, etag: str | None, last_modified: datetime | None
) -> str:
    """The id of one synthetic change: the same for the same drift, run after run."""
    stamp = format_time(last_modified) if last_modified is not None else None
    return derived_id(SOURCE, event_type, bucket, key, strip_quotes(etag), stamp)


def normalize(delivery: Delivery) -> list[FileEvent]:
    body = require_dict(load_json(delivery.body), "body")
    event_type = require_str(body.get("type"), "type")
    if event_type not in TYPES:
        raise MalformedDelivery(f"type {event_type!r} is neither 'created' nor 'deleted'")
    # Always named, so that a body that forgot it is not read as bucketless; null only for
    # the providers that have no buckets (their own events name none either).
    bucket = (
        None
        if "bucket" in body and body["bucket"] is None
        else require_str(body.get("bucket"), "bucket")
    )
    key = require_str(body.get("key"), "key")
    etag = strip_quotes(optional_str(body.get("etag"), "etag"))
    size = optional_int(body.get("size"), "size")
    last_modified = parse_time(body.get("last_modified"), "last_modified")
    observed_at = parse_time(body.get("observed_at"), "observed_at")
    optional_str(body.get("instance"), "instance")  # routing reads it from `raw`
    event_id = present(body.get("id"), "id") or reconcile_id(
        event_type, bucket, key, etag, last_modified
    )
    deleted = event_type == "deleted"
    return [
        FileEvent(
            id=event_id,
            type="deleted" if deleted else "created",
            key=key,
            bucket=bucket,
            size=size,
            etag=etag,
            time=observed_at or last_modified,
            provider=SOURCE,
            version_only=False if deleted else None,
            raw=body,
        )
    ]
