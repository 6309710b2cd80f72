"""Google Cloud Storage notifications through Pub/Sub (pull and push) -> FileEvent.

Format: https://cloud.google.com/storage/docs/pubsub-notifications (PROVIDERS.md §3, GCS-PN).
A notification is a Pub/Sub message: attributes (`eventType`, `bucketId`, `objectId`,
`objectGeneration`, `eventTime`, `payloadFormat`, `overwroteGeneration`,
`overwrittenByGeneration`, ...) plus, with `payloadFormat=JSON_API_V1`, data holding the JSON
object resource (`name`, `bucket`, `generation`, `metageneration`, `size`, `etag`, `updated`,
`timeDeleted`, ...); with `NONE` the data is empty and only the attributes exist.

Deliveries:
* pull: `body` is the message data (already base64-decoded, maybe empty) and
  `delivery.attributes` the message attributes.
* push: `body` is the envelope `{"message": {"data": <base64>, "attributes": {...},
  "messageId", "publishTime", ...}, "subscription": ...}`; it is unwrapped and its attributes
  are merged over `delivery.attributes`. The same change gives the same event either way.

Event kinds:
* `OBJECT_FINALIZE` -> `created` (new object or new generation, incl. copy/rewrite/restore and
  an overwrite, which carries `overwroteGeneration`).
* `OBJECT_ARCHIVE` -> `deleted`, version_only False: the live version became noncurrent, so
  the key no longer resolves to a live object.
* `OBJECT_DELETE` -> `deleted`, version_only None: it is sent both when a live object goes
  (versioning off, lifecycle) and when a noncurrent generation is purged while the key may
  still be live, and nothing documented in the message tells the two apart. (`timeDeleted`
  predating `eventTime` would hint at a purge, but that is an unverified inference; it stays
  in `raw` for consumers who want to try.)
* dropped on purpose (no event): ARCHIVE/DELETE carrying `overwrittenByGeneration` (the old
  generation of an overwrite; its `OBJECT_FINALIZE` arrives separately and is the change);
  `OBJECT_METADATA_UPDATE` (PROVIDERS §11 #1: content unchanged, same generation, only a new
  metageneration, so there is nothing for a file consumer to fetch or remove);
  `OBJECT_INITIALIZE` (zonal buckets: creation has only started, nothing is committed); any
  other, future, event type.

Id: GCS has no per-event id (the Pub/Sub messageId differs between copies of one event), so
`derived_id("gcs", eventType, bucket, key, generation)`, with the provider's own eventType so
that an OBJECT_ARCHIVE and a later OBJECT_DELETE purge of the same generation stay distinct.
Never messageId or publishTime.

Key and bucket: `objectId` / payload `name` and `bucketId` / payload `bucket`, raw. Object
names are not URL-encoded in either place (only `selfLink`/`mediaLink` are), and NFC/NFD
forms are different names, so nothing is decoded or normalised. When both attribute and
payload are present they must agree, or the delivery is malformed.

Other fields: sequencer and version_id = the generation as a decimal string (ordering
compares generation, then `raw["metageneration"]`); size = payload `size` (a string) as int;
etag = payload `etag` (a GCS token, not an MD5) with one pair of surrounding quotes stripped.
time (PROVIDERS §11 #12): attribute `eventTime`; 2017-era messages have none, so fall back to
the payload's `timeDeleted` for deletes and `updated` for creates; never `publishTime`, which
is transport time. Otherwise None. raw = the object resource plus an "attributes" key (the
merged message attributes); only {"attributes": ...} with payloadFormat NONE.

Sizes and etags on deletes (PROVIDERS §11 #14) are passed through: a delete payload is the
metadata as it was before the delete.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from streams.core.delivery import Delivery
from streams.core.event import EventType, FileEvent
from streams.core.normalizers.base import (
    MalformedDelivery,
    derived_id,
    load_json,
    optional_int,
    optional_str,
    parse_time,
    reject_lone_surrogates,
    require_dict,
    require_str,
    strip_quotes,
)

SOURCE = "gcs"

# eventType -> (canonical type, version_only). Anything not listed is dropped.
_MAPPED: dict[str, tuple[EventType, bool | None]] = {
    "OBJECT_FINALIZE": ("created", None),
    "OBJECT_ARCHIVE": ("deleted", False),
    "OBJECT_DELETE": ("deleted", None),
}

# A generation is an int64; anything longer is not one (and would be slow to convert).
_MAX_GENERATION_DIGITS = 20


def normalize(delivery: Delivery) -> list[FileEvent]:
    """The canonical events in one GCS Pub/Sub delivery (zero or one)."""
    attributes = _attributes(delivery.attributes, "delivery attributes")
    # The body's JSON is checked by load_json; the attributes come from the transport.
    if not _all_text(attributes):
        reject_lone_surrogates(attributes, "delivery attributes")  # refuses, saying why
    resource: dict[str, Any] | None = None
    if delivery.body.strip():
        document = require_dict(load_json(delivery.body, "body"), "body")
        if "message" in document:
            # Push envelope: the object resource is base64 inside, attributes beside it.
            message = require_dict(document["message"], "push envelope `message`")
            inner = message.get("attributes")
            if inner is not None:
                attributes = {**attributes, **_attributes(inner, "push message attributes")}
            resource = _decode_data(message.get("data"))
        else:
            resource = document
    event = _event(attributes, resource)
    return [event] if event is not None else []


def _event(attributes: dict[str, str], resource: dict[str, Any] | None) -> FileEvent | None:
    event_type = require_str(attributes.get("eventType"), "attribute eventType")
    mapped = _MAPPED.get(event_type)
    if mapped is None:
        return None  # METADATA_UPDATE, INITIALIZE, unknown kinds: dropped on purpose.
    if event_type != "OBJECT_FINALIZE" and attributes.get("overwrittenByGeneration"):
        return None  # The old generation of an overwrite; the FINALIZE is the change.
    kind, version_only = mapped

    payload = resource or {}
    bucket = _agreeing(attributes, "bucketId", payload, "bucket")
    key = _agreeing(attributes, "objectId", payload, "name")
    generation = _generation(attributes, payload)

    time = parse_time(attributes.get("eventTime"), "attribute eventTime")
    if time is None:
        fallback = "updated" if kind == "created" else "timeDeleted"
        time = parse_time(payload.get(fallback), f"payload {fallback}")

    raw: dict[str, Any] = {**payload, "attributes": attributes}
    # Every value checked above as validation would (exact str, int not bool, time in UTC,
    # raw a fresh dict): no per-event validation (tests/normalizers/test_gcs.py holds it).
    return FileEvent.from_checked(
        id=derived_id(SOURCE, event_type, bucket, key, generation),
        type=kind,
        key=key,
        bucket=bucket,
        size=optional_int(payload.get("size"), "payload size"),
        etag=strip_quotes(optional_str(payload.get("etag"), "payload etag")),
        version_id=generation,
        time=time,
        sequencer=generation,
        provider=SOURCE,
        version_only=version_only,
        raw=raw,
    )


def _all_text(attributes: dict[str, str]) -> bool:
    """Whether no name or value of `attributes` holds a lone surrogate: one encode of them
    all, where reject_lone_surrogates walks them one by one (a surrogate stays lone when
    joined to another string: Python never pairs them)."""
    try:
        "".join((*attributes, *attributes.values())).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _attributes(value: Any, what: str) -> dict[str, str]:
    """Pub/Sub attributes: a map of strings to strings."""
    if not isinstance(value, Mapping):
        raise MalformedDelivery(f"{what} are not a map of strings")
    result: dict[str, str] = {}
    for name, text in value.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise MalformedDelivery(f"{what}: {name!r} is not a string attribute")
        result[name] = text
    return result


def _decode_data(data: Any) -> dict[str, Any] | None:
    """The push message's base64 `data`: the object resource, or None (payloadFormat NONE)."""
    if data is None or data == "":
        return None
    if not isinstance(data, str):
        raise MalformedDelivery("push message `data` is not a base64 string")
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedDelivery("push message `data` is not valid base64") from None
    if not decoded.strip():
        return None
    what = "push message data"
    return require_dict(load_json(decoded, what), what)


def _agreeing(
    attributes: dict[str, str], attribute: str, payload: dict[str, Any], field: str
) -> str:
    """One identity field from the attribute, else the payload; both, if given, must agree."""
    from_attribute = attributes.get(attribute) or None
    from_payload = optional_str(payload.get(field), f"payload {field}") or None
    if from_attribute and from_payload and from_attribute != from_payload:
        raise MalformedDelivery(
            f"attribute {attribute} {from_attribute!r} differs from "
            f"payload {field} {from_payload!r}"
        )
    value = from_attribute or from_payload
    if value is None:
        raise MalformedDelivery(f"no {attribute} attribute and no payload {field}")
    return value


def _generation(attributes: dict[str, str], payload: dict[str, Any]) -> str:
    from_attribute = _decimal(attributes.get("objectGeneration"), "attribute objectGeneration")
    from_payload = _decimal(payload.get("generation"), "payload generation")
    if from_attribute and from_payload and int(from_attribute) != int(from_payload):
        raise MalformedDelivery(
            f"attribute objectGeneration {from_attribute} differs from payload generation "
            f"{from_payload}"
        )
    value = from_attribute or from_payload
    if value is None:
        raise MalformedDelivery("no objectGeneration attribute and no payload generation")
    return value


def _decimal(value: Any, what: str) -> str | None:
    """A generation: a decimal string (kept verbatim) or, in some test data, a JSON number."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if (
        isinstance(value, str)
        and value.isascii()
        and value.isdigit()
        and len(value) <= _MAX_GENERATION_DIGITS
    ):
        return value
    raise MalformedDelivery(f"{what} is not a generation number: {value!r}")
