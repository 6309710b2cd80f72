"""MinIO bucket notifications (webhook, Kafka and the other targets) -> canonical events.

Format
    https://min.io/docs/minio/linux/administration/monitoring/bucket-notifications.html,
    `minio/minio:docs/bucket/notifications/README.md`; source of truth `minio/minio`:
    `internal/event/event.go` (record shape), `internal/event/name.go` (kinds),
    `cmd/event-notification.go` (`ToEvent`: key escaping, sequencer), `cmd/bucket-lifecycle.go`
    (lifecycle kinds), `internal/event/target/webhook.go` (one record per POST).

Body: `{"EventName", "Key", "Records": [<S3-shaped record>]}`; before 2018 `EventType` plus
logrus `level`/`msg`/`time`. Only `Records` is read (parsed as in `s3.record_events`); the
top-level `Key` is already decoded and is never decoded again. Record `eventSource` is
`minio:s3` (2016-2017 servers wrote `aws:s3`, accepted too).

Kinds (record `eventName`, `s3:` prefix kept as MinIO sends it)
    * created: `s3:ObjectCreated:{Put,Post,Copy,CompleteMultipartUpload}`;
    * deleted, one version (True when the record names a version): `s3:ObjectRemoved:Delete`;
    * deleted, live object gone: `s3:ObjectRemoved:DeleteMarkerCreated`,
      `s3:ObjectRemoved:DeleteAllVersions` (lifecycle removed every version),
      `s3:LifecycleDelMarkerExpiration:Delete` (lifecycle removed a delete marker that was the
      latest version, and the versions under it: the key stays gone, its history is purged);
    * dropped on purpose (§11 #18): the metadata-only `s3:ObjectCreated:{PutRetention,
      PutLegalHold,PutTagging,DeleteTagging}` (content unchanged), `s3:ObjectRemoved:NoOP`
      (a DeleteObject whose key or version did not exist: nothing was removed),
      `s3:ObjectAccessed:*`, `s3:Replication:*`, `s3:ObjectRestore:*`, `s3:ObjectTransition:*`,
      `s3:Scanner:*`, `s3:BucketCreated/Removed`, and unknown kinds.

Id: MinIO has no event id. `derived_id("minio", eventName, bucket, key, sequencer)`; the
sequencer (hex of the object's ModTime in ns, else of the event time) is kept byte-identical
when `queue_dir` replays an event. Fallbacks as for S3 (version, time, eTag; then a record hash).

Key: record keys are Go `url.QueryEscape` output (`a b+c/ü.txt` -> `a+b%2Bc%2F%C3%BC.txt`):
`form_decode`. (ListenBucketNotification sends keys unescaped; it is not a source here.)

Fields: as S3. The legacy placeholder `versionId` `"1"` (pre-versioning MinIO put it on every
event, deletes included) names no version: `version_id` is None and a Delete carrying it is a
live delete (`version_only` False); the record in `raw` keeps it. Versioned MinIO sends UUIDs.
"""

from __future__ import annotations

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers.base import MalformedDelivery, load_json, require_dict
from streams.core.normalizers.s3 import Kind, record_events

SOURCE = "minio"

_KINDS: dict[str, Kind] = {
    "s3:ObjectCreated:Put": "created",
    "s3:ObjectCreated:Post": "created",
    "s3:ObjectCreated:Copy": "created",
    "s3:ObjectCreated:CompleteMultipartUpload": "created",
    "s3:ObjectRemoved:Delete": "version_delete",
    "s3:ObjectRemoved:DeleteMarkerCreated": "deleted",
    "s3:ObjectRemoved:DeleteAllVersions": "deleted",
    "s3:LifecycleDelMarkerExpiration:Delete": "deleted",
}
_EVENT_SOURCES = frozenset({"minio:s3", "aws:s3"})
_PLACEHOLDER_VERSIONS = frozenset({"1"})


def normalize(delivery: Delivery) -> list[FileEvent]:
    """Every created/deleted event in one MinIO notification, in record order."""
    body = require_dict(load_json(delivery.body), "MinIO notification")
    records = body.get("Records")
    if not isinstance(records, list):
        raise MalformedDelivery("MinIO notification has no Records array")
    events: list[FileEvent] = []
    for index, record in enumerate(records):
        events.extend(
            record_events(
                record,
                index,
                SOURCE,
                _KINDS.get,
                _EVENT_SOURCES,
                _PLACEHOLDER_VERSIONS,
            )
        )
    return events
