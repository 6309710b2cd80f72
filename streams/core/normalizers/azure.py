"""Azure Blob Storage events through Event Grid (webhook or Storage Queue) -> FileEvent.

Format: https://learn.microsoft.com/azure/event-grid/event-schema-blob-storage (EG-BLOB),
the data schemas in Azure/azure-rest-api-specs `specification/eventgrid/data-plane/
Microsoft.Storage/stable/2018-01-01/Storage.json` and its examples (EG-SPEC), CloudEvents in
`articles/event-grid/cloud-event-schema.md` (EG-CE); PROVIDERS.md §4.

Deliveries: an Event Grid schema event `{id, topic, subject, eventType, eventTime, data, ...}`
or a CloudEvents 1.0 event `{specversion, id, source, subject, type, time, data}`, either
alone or in a JSON array (events come out in array order). A body that is not JSON but the
base64 text of such JSON is decoded first: that is how Event Grid delivers to an Azure Storage
Queue, and the queue bridge forwards the message text unchanged. The CloudEvents examples in
EG-SPEC spell `specVersion`; both spellings are recognised, as is an object with `type` and
no `eventType`.

Event kinds (`data.api` names the operation):
* `Microsoft.Storage.BlobCreated` -> `created` (PutBlob, PutBlockList, CopyBlob, ADLS
  FlushWithClose, SFTP SftpCommit, and any other API), except, dropped on purpose (PROVIDERS
  §11 #3): ADLS `CreateFile` and SFTP `SftpCreate`. Both fire when a file is opened, for an
  empty or unfinished blob; the committed content is announced by the `FlushWithClose` /
  `SftpCommit` BlobCreated that follows, as EG-BLOB advises filtering on. (A file created and
  never flushed stays invisible here: only a reconciliation listing sees it.) On accounts with
  a hierarchical namespace a CopyBlob BlobCreated fires when the copy starts; it is the only
  event for that copy, so it is emitted.
* `Microsoft.Storage.BlobDeleted` -> `deleted`, version_only None: Event Grid blob events carry
  no version or snapshot field, so the payload cannot say whether a live blob or a version went.
* `Microsoft.Storage.BlobRenamed` (hierarchical namespace: ADLS RenameFile, SFTP SftpRename;
  PROVIDERS §11 #2) -> two events: `deleted` for the old name (version_only False: the name
  is gone) with id `f"{id}:deleted"`, then `created` for the new name (the subject) with id
  `f"{id}:created"`. A consumer keyed by name must forget the old key and fetch the new one.
  The old name exists only in `data.sourceUrl` (or `sourceBlobUrl`); no public example shows
  whether these URLs percent-encode, so the encoding is learnt from the paired
  `destinationUrl`, whose path must equal the subject either verbatim or percent-decoded
  (never form-decoded); when that cannot be established the delivery is malformed rather
  than silently losing the delete. Both events carry the rename's sequencer (inference: the
  sequencer looks like a per-partition counter) and no size or etag (the event has none).
* dropped on purpose (no event): `DirectoryCreated` (no object appears), `DirectoryRenamed`
  and `DirectoryDeleted` (they affect every key below a prefix, which no per-key event can
  express; a reconciliation listing must catch those keys), `BlobTierChanged` and
  `AsyncOperationInitiated` (content unchanged or not yet changed), policy and task events
  (`BlobInventoryPolicyCompleted`, `LifecyclePolicyCompleted`, `StorageTask*`: not about one
  blob), `Microsoft.EventGrid.SubscriptionValidationEvent` / `SubscriptionDeletedEvent` (the
  webhook bridge answers the handshake), and every other event type.

Id: the event's `id`, exactly (it is unchanged on redelivery and in dead-letter copies, in
both schemas); `:deleted` / `:created` suffixes only for the two halves of a rename.

Key and bucket (PROVIDERS §11 #17): from `subject`
(`/blobServices/default/containers/<container>/blobs/<path>`; the leading slash is optional,
as in the EG-CE sample): bucket = the container, key = everything after the first `/blobs/`,
verbatim, never URL-decoded. The storage account is not part of the bucket: containers are
unique only per account and one batch can mix accounts, but every other provider's bucket is
the provider's own bucket name, and instance configuration names a container; the account
stays in `raw` (`topic` / `source`) for deployments that share a topic between accounts.

Other fields: sequencer = `data.sequencer` verbatim (compare ordinally, per blob name);
size = `data.contentLength`; etag = `data.eTag` with one pair of surrounding quotes stripped
(EG-BLOB quotes it, real events do not; §11 #15); version_id = `data.versionId` if present;
time = `eventTime` / CloudEvents `time` as UTC (7 fraction digits are truncated to 6);
raw = the event object. Sizes and etags on deletes are passed through as given (§11 #14).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any
from urllib.parse import unquote

from pydantic import ValidationError

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers.base import (
    MalformedDelivery,
    load_json,
    optional_int,
    optional_str,
    parse_time,
    require_dict,
    require_str,
    strip_quotes,
)

SOURCE = "azure"

_CREATED = "Microsoft.Storage.BlobCreated"
_DELETED = "Microsoft.Storage.BlobDeleted"
_RENAMED = "Microsoft.Storage.BlobRenamed"

# BlobCreated APIs that fire for an empty or unfinished file; a commit event follows.
_UNCOMMITTED_APIS = frozenset({"CreateFile", "SftpCreate"})

_SUBJECT_PREFIX = "blobServices/default/containers/"
_BLOBS = "blobs/"
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


def normalize(delivery: Delivery) -> list[FileEvent]:
    """The canonical events in one Event Grid delivery, in array order."""
    events = _events(delivery.body)
    result: list[FileEvent] = []
    for index, event in enumerate(events):
        result.extend(_normalize_event(event, f"event {index}"))
    return result


def _events(body: bytes) -> list[Any]:
    """The body as a list of events: JSON, or base64 of JSON (Storage Queue delivery)."""
    text = body.strip()
    what = "body"
    if not text:
        raise MalformedDelivery("body is empty")
    if text[:1] not in (b"{", b"["):
        try:
            text = base64.b64decode(b"".join(text.split()), validate=True)
        except (binascii.Error, ValueError):
            raise MalformedDelivery("body is neither JSON nor base64 of JSON") from None
        what = "base64-decoded body"
    document = load_json(text, what)
    if isinstance(document, dict):
        return [document]
    if isinstance(document, list):
        return document
    raise MalformedDelivery(f"{what} is neither an event object nor an array of events")


def _normalize_event(value: Any, where: str) -> list[FileEvent]:
    event = require_dict(value, where)
    if "specversion" in event or "specVersion" in event or "eventType" not in event:
        type_field, time_field = "type", "time"  # CloudEvents 1.0
    else:
        type_field, time_field = "eventType", "eventTime"  # Event Grid schema
    if type_field not in event:
        raise MalformedDelivery(
            f"{where} has neither eventType (Event Grid) nor type (CloudEvents)"
        )
    event_type = require_str(event[type_field], f"{where} {type_field}")
    if event_type not in (_CREATED, _DELETED, _RENAMED):
        return []  # validation, directory, tier, policy and foreign events: dropped on purpose

    event_id = require_str(event.get("id"), f"{where} id")
    container, key = _blob_path(event.get("subject"), where)
    data = require_dict(event.get("data"), f"{where} data")
    api = optional_str(data.get("api"), f"{where} data.api")
    if event_type == _CREATED and api in _UNCOMMITTED_APIS:
        return []  # CreateFile / SftpCreate: the committing FlushWithClose / SftpCommit follows

    common: dict[str, Any] = {
        "time": parse_time(event.get(time_field), f"{where} {time_field}"),
        "sequencer": optional_str(data.get("sequencer"), f"{where} data.sequencer"),
        "provider": SOURCE,
        "raw": event,
    }
    if event_type == _RENAMED:
        old_container, old_key = _rename_source(data, container, key, where)
        return [
            _file_event(
                id=f"{event_id}:deleted",
                type="deleted",
                key=old_key,
                bucket=old_container,
                version_only=False,
                **common,
            ),
            _file_event(
                id=f"{event_id}:created", type="created", key=key, bucket=container, **common
            ),
        ]
    return [
        _file_event(
            id=event_id,
            type="created" if event_type == _CREATED else "deleted",
            key=key,
            bucket=container,
            size=optional_int(data.get("contentLength"), f"{where} data.contentLength"),
            etag=strip_quotes(optional_str(data.get("eTag"), f"{where} data.eTag")),
            version_id=optional_str(data.get("versionId"), f"{where} data.versionId"),
            **common,
        )
    ]


def _blob_path(subject: Any, where: str) -> tuple[str, str]:
    """(container, blob path) from `/blobServices/default/containers/<c>/blobs/<path>`."""
    text = require_str(subject, f"{where} subject")
    path = text[1:] if text.startswith("/") else text  # EG-CE's sample has no leading slash
    container, slash, rest = path.removeprefix(_SUBJECT_PREFIX).partition("/")
    if (
        not path.startswith(_SUBJECT_PREFIX)
        or not container
        or not slash
        or not rest.startswith(_BLOBS)
        or rest == _BLOBS
    ):
        raise MalformedDelivery(f"{where} subject is not a blob path: {text!r}")
    return container, rest[len(_BLOBS) :]


def _rename_source(data: dict[str, Any], container: str, key: str, where: str) -> tuple[str, str]:
    """(container, key) of a renamed blob's old name, from its source URL."""
    for source_field, destination_field in (
        ("sourceUrl", "destinationUrl"),
        ("sourceBlobUrl", "destinationBlobUrl"),
    ):
        source, destination = data.get(source_field), data.get(destination_field)
        if isinstance(source, str) and isinstance(destination, str):
            resolved = _resolve_source(source, destination, (container, key))
            if resolved is not None:
                return resolved
    raise MalformedDelivery(
        f"{where} is a BlobRenamed whose source URL cannot be read against its subject "
        "(missing, or a destination URL that matches the subject neither verbatim nor "
        "percent-decoded), so the old key is unknown"
    )


def _resolve_source(
    source: str, destination: str, subject: tuple[str, str]
) -> tuple[str, str] | None:
    """Read the source URL the way the destination URL must be read to give the subject."""
    source_path, destination_path = _url_path(source), _url_path(destination)
    if source_path is None or destination_path is None:
        return None
    verbatim = destination_path == subject
    decoded = _percent_decode(destination_path) == subject
    if verbatim and decoded:
        # The destination has no escapes; only the source itself can tell.
        encoded = source.isascii() and " " not in source and bool(_ESCAPE.search(source))
    elif verbatim or decoded:
        encoded = decoded
    else:
        return None
    return _percent_decode(source_path) if encoded else source_path


def _url_path(url: str) -> tuple[str, str] | None:
    """(container, path) of `https://<host>/<container>/<path>`, split by hand: a raw name may
    hold `?` or `#`, which a URL parser would cut off."""
    _, scheme_sep, rest = url.partition("://")
    _, slash, path = rest.partition("/")
    container, slash2, tail = path.partition("/")
    if not scheme_sep or not slash or not slash2 or not container or not tail:
        return None
    return container, tail


def _percent_decode(path: tuple[str, str]) -> tuple[str, str] | None:
    try:
        return unquote(path[0], errors="strict"), unquote(path[1], errors="strict")
    except UnicodeDecodeError:
        return None


def _file_event(**fields: Any) -> FileEvent:
    try:
        return FileEvent(**fields)
    except ValidationError as exc:  # Belt and braces: the contract is MalformedDelivery only.
        raise MalformedDelivery(f"cannot build the event: {exc}") from None
