"""Supabase Database Webhook on `storage.objects` -> canonical file events.

Format: `supabase/supabase:docker/volumes/db/webhooks.sql` (`supabase_functions.http_request`
posts `jsonb_build_object('old_record', OLD, 'record', NEW, 'type', TG_OP, 'table',
TG_TABLE_NAME, 'schema', TG_TABLE_SCHEMA)`) and https://supabase.com/docs/guides/database/webhooks;
row columns from `supabase/storage` `migrations/tenant/` (`bucket_id`, `name`, `version`,
`metadata`, `updated_at`, and since 2026 `archived_at`, `is_delete_marker`, `is_versioned`).
Only rows of `storage.objects` are accepted; a hook on any other table is malformed here.

Kinds (`type` = TG_OP):
* `INSERT` -> `created` (`record`).
* `UPDATE` -> depends on what changed between `old_record` and `record`:
  - `bucket_id`/`name` changed (a move, PROVIDERS §11 #4): `deleted` (old key, version_only
    False) + `created` (new key), ids `f"{id}:deleted"` / `f"{id}:created"`. A consumer
    keyed by object name must see the old name go, or it keeps a key that no longer exists.
  - `version` changed, same name: an overwrite (`upsertObject` is INSERT ... ON CONFLICT DO
    UPDATE), so `created`.
  - same `version` (§11 #5): metadata only (`user_metadata`, `last_accessed_at`, ...) ->
    dropped, no event. Rows written before the `version` column existed carry none on either
    side; for those a changed `metadata.eTag` counts as new content.
* `DELETE` -> `deleted` (`old_record`), version_only False: with versioning off (the default)
  the row is the object, so the key is gone.
* Object versioning columns (dark until `supabase/storage` unlocks them, read defensively, an
  inference from the column names and migrations 0062-0071): an INSERT of a delete-marker row
  is `deleted` (version_only False), never `created`; an UPDATE that archives a row (sets
  `archived_at`) is dropped (the write that superseded it arrives as its own INSERT); a DELETE
  of an archived row is `deleted` with version_only True; a DELETE of a delete-marker row is
  dropped (what it uncovers is not in the payload); a DELETE of a current row of a versioned
  bucket has version_only None (an older version may now be current).

Id: Supabase has no event id. `derived_id("supabase", TG_OP, bucket_id, name, version)`, the
row `version` being a fresh uuid on every write (taken from `old_record` on DELETE). Without
a version: `derived_id(..., None, updated_at, eTag)`; failing those, `record_hash_id` of the
payload. A move uses the UPDATE's id with `:deleted` / `:created`.

Key: `name` verbatim (never URL-encoded; spaces, `+`, `%` are literal). Bucket: `bucket_id`.

Fields: size = `metadata.size`; etag = `metadata.eTag` with its one pair of literal double
quotes stripped (§11 #15); version_id = `version`; size/etag on deletes are passed through
from `old_record` (§11 #14). time (§11 #12) = `record.updated_at` for INSERT/UPDATE (a
trigger keeps it current on every write); a DELETE carries no time (`old_record.updated_at`
is the last write, not the delete), so time is None. sequencer None (`version` is random).
raw = the whole payload: the row change with its type and both row images.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    strip_quotes,
)

SOURCE = "supabase"


@dataclass(frozen=True, slots=True)
class _Row:
    """The fields of one `storage.objects` row image that an event needs."""

    bucket: str
    key: str
    version: str | None
    size: int | None
    etag: str | None
    updated_at: datetime | None
    archived: bool
    delete_marker: bool
    versioned: bool


def normalize(delivery: Delivery) -> list[FileEvent]:
    payload = require_dict(load_json(delivery.body), "body")
    if payload.get("schema") != "storage" or payload.get("table") != "objects":
        raise MalformedDelivery(
            f"not a storage.objects webhook: schema={payload.get('schema')!r}, "
            f"table={payload.get('table')!r}"
        )
    op = require_str(payload.get("type"), "type")
    if op == "INSERT":
        return _insert(payload, _row(payload.get("record"), "record"))
    if op == "UPDATE":
        return _update(
            payload,
            _row(payload.get("old_record"), "old_record"),
            _row(payload.get("record"), "record"),
        )
    if op == "DELETE":
        return _delete(payload, _row(payload.get("old_record"), "old_record"))
    raise MalformedDelivery(f"type {op!r} is not INSERT, UPDATE or DELETE")


def _insert(payload: dict[str, Any], new: _Row) -> list[FileEvent]:
    event_id = _event_id("INSERT", new, payload)
    if new.delete_marker:
        # A delete marker hides the key: it must never read as a new object.
        return [_event(event_id, "deleted", new, new.updated_at, payload, version_only=False)]
    return [_event(event_id, "created", new, new.updated_at, payload)]


def _update(payload: dict[str, Any], old: _Row, new: _Row) -> list[FileEvent]:
    if new.archived:
        return []  # the row became noncurrent; the superseding write has its own INSERT
    event_id = _event_id("UPDATE", new, payload)
    if (old.bucket, old.key) != (new.bucket, new.key):
        return [
            _event(
                f"{event_id}:deleted", "deleted", old, new.updated_at, payload, version_only=False
            ),
            _event(f"{event_id}:created", "created", new, new.updated_at, payload),
        ]
    if old.version is None and new.version is None:
        changed = old.etag != new.etag
    else:
        changed = old.version != new.version
    if not changed:
        return []  # metadata-only update: same content under the same key
    return [_event(event_id, "created", new, new.updated_at, payload)]


def _delete(payload: dict[str, Any], old: _Row) -> list[FileEvent]:
    if old.delete_marker:
        return []  # removing a marker uncovers a version the payload does not describe
    if old.archived:
        version_only: bool | None = True
    elif old.versioned:
        version_only = None
    else:
        version_only = False
    event_id = _event_id("DELETE", old, payload)
    # DELETE carries no time: updated_at of the deleted row is its last write, not the delete.
    return [_event(event_id, "deleted", old, None, payload, version_only=version_only)]


def _row(value: Any, what: str) -> _Row:
    row = require_dict(value, what)
    metadata = row.get("metadata")
    if metadata is None:
        metadata = {}  # rows still being uploaded have no metadata yet
    metadata = require_dict(metadata, f"{what}.metadata")
    return _Row(
        bucket=require_str(row.get("bucket_id"), f"{what}.bucket_id"),
        key=require_str(row.get("name"), f"{what}.name"),
        version=present(row.get("version"), f"{what}.version"),
        size=optional_int(metadata.get("size"), f"{what}.metadata.size"),
        etag=strip_quotes(optional_str(metadata.get("eTag"), f"{what}.metadata.eTag")),
        updated_at=parse_time(row.get("updated_at"), f"{what}.updated_at"),
        archived=row.get("archived_at") is not None,
        delete_marker=row.get("is_delete_marker") is True,
        versioned=row.get("is_versioned") is True,
    )


def _event_id(op: str, row: _Row, payload: dict[str, Any]) -> str:
    return change_id(
        SOURCE, op, row.bucket, row.key, row.version, row.updated_at, row.etag, payload
    )


def _event(
    event_id: str,
    kind: EventType,
    row: _Row,
    time: datetime | None,
    payload: dict[str, Any],
    *,
    version_only: bool | None = None,
) -> FileEvent:
    return FileEvent(
        id=event_id,
        type=kind,
        key=row.key,
        bucket=row.bucket,
        size=row.size,
        etag=row.etag,
        version_id=row.version,
        time=time,
        provider=SOURCE,
        version_only=version_only if kind == "deleted" else None,
        raw=payload,
    )
