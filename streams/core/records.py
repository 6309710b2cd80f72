"""The Kafka records the stream reads and writes, as plain data (no I/O here).

* Raw record (bridges -> `files.raw`): value = the provider's bytes exactly as delivered;
  headers `source`, optional `transport`, `delivery-id`, `received-at`,
  `header.<lower-case http header>`, `attribute.<pub/sub attribute>`; key free.
* Keyed record (normalize -> repartition topic): key = `<instance>/<bucket>/<key>` so every copy
  of one change and every change of one key land on one partition; value = the canonical
  event as JSON, byte for byte what the output record will carry (stage two passes the bytes
  through, never parsing them); headers `instance`, `received-at`, and `head`: what stage two
  decides on, packed (streams.core.keyedhead). Also read: keyed records without a
  `head` (the event's JSON is then read for those fields), and records of the first format,
  value `{"instance": ..., "event": {...}}`: a worker upgraded in place reads what the
  previous release left in the repartition topic.
* Output record (-> `files.events.<instance>`): key = the caller-facing key, value = the
  canonical event as JSON, CloudEvents 1.0 binary-mode headers, `ce_dataschema` naming the
  event's JSON Schema (streams.core.schema).
* Stale record (-> `files.stale.<instance>`): the event, plus `stale.reason` headers.
* Dead-letter record (-> `files.dead-letter`): original bytes and headers, plus `error`
  and `error.stage`.

Sizes: `record_bytes` bounds what one record takes in a record batch of its own, the unit
Kafka's `max.message.bytes` limits; `event_record_bytes` the largest record one event
becomes on its way (keyed, output, stale), so stage one can refuse an event before any of its
records is written, against `EVENT_MAX_MESSAGE_BYTES` (the topics are created with it).
The keyed head: streams.core.keyedhead.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, get_args

import orjson

from streams.core.delivery import Delivery
from streams.core.event import EventType, FileEvent, format_time
from streams.core.keyedhead import pack_head, unpack_head
from streams.core.schema import FILE_EVENT_SCHEMA_URI

Headers = tuple[tuple[str, bytes], ...]

CE_SPECVERSION = "1.0"
CE_SPECVERSION_BYTES = CE_SPECVERSION.encode()
CE_TYPE_PREFIX = "storage.object."
CE_DATASCHEMA_BYTES = FILE_EVENT_SCHEMA_URI.encode()
"""`ce_dataschema`: the versioned JSON Schema of the value (streams.core.schema); one constant."""
EVENT_TYPES = frozenset(get_args(EventType))
HEADER_PREFIX = "header."
ATTRIBUTE_PREFIX = "attribute."


@dataclass(slots=True, init=False)  # the __init__ below: see the class docstring
class OutRecord:
    """One record to produce.

    Not frozen (a frozen init costs 4x), and its `__init__` written out, as RawRecord's and
    KeyedEvent's: mypyc compiles it, where a dataclass's generated one runs interpreted
    (~4x slower; several of these per record)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    partition: int | None
    """Set only where the partition is dictated (changelog records); else by key."""

    def __init__(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers = (),
        partition: int | None = None,
    ) -> None:
        self.topic = topic
        self.key = key
        self.value = value
        self.headers = headers
        self.partition = partition


@dataclass(slots=True, init=False)  # its __init__ compiled: see OutRecord
class RawRecord:
    """One record read from a raw topic."""

    topic: str
    value: bytes
    headers: Mapping[str, bytes | None]

    def __init__(
        self, topic: str, value: bytes, headers: Mapping[str, bytes | None] | None = None
    ) -> None:
        self.topic = topic
        self.value = value
        self.headers = {} if headers is None else headers


def header_text(headers: Mapping[str, bytes | None], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    return value.decode("utf-8", errors="replace")


def delivery_from_raw(record: RawRecord, default_source: str | None) -> Delivery:
    """The Delivery a raw record carries; `source` header wins over the topic's default."""
    source = header_text(record.headers, "source") or default_source or ""
    headers: dict[str, str] = {}
    attributes: dict[str, str] = {}
    for name, value in record.headers.items():
        text = value.decode("utf-8", errors="replace") if value is not None else ""
        if name.startswith(HEADER_PREFIX):
            headers[name[len(HEADER_PREFIX) :].lower()] = text
        elif name.startswith(ATTRIBUTE_PREFIX):
            attributes[name[len(ATTRIBUTE_PREFIX) :]] = text
    return Delivery(source=source, body=record.value, headers=headers, attributes=attributes)


def partition_key(instance: str, bucket: str | None, key: str) -> bytes:
    """The repartition key: one partition per (instance, bucket, object key).

    The bucket is part of it because an instance may take every bucket, where one key can
    name two different objects. Bucket names cannot hold a `/`.
    """
    return f"{instance}/{bucket or ''}/{key}".encode()


INSTANCE_HEADER = "instance"
RECEIVED_AT_HEADER = "received-at"
KEYED_HEAD_HEADER = "head"
EVENT_MAX_MESSAGE_BYTES = 1024 * 1024
"""`max.message.bytes` of the topics an event's records go through: keyed (repartition
topic), output, stale, and the changelog records derived from it (its key's record, bounded:
streams.core.keystate). Stage one dead-letters an event whose records would not fit
(streams.core.routing, `event_record_bytes`)."""
RAW_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""`max.message.bytes` of a raw topic: a raw record as a bridge writes it, headers included
(the webhook's body limit is 1 MiB by default; the bridges bound the whole record to this)."""


def keyed_record(
    topic: str, instance: str, event: FileEvent, received_at: bytes | None
) -> OutRecord:
    """The repartition record of `event` for `instance`: its JSON as the output will carry
    it, and the head stage two decides on (module docstring)."""
    headers: Headers = ((INSTANCE_HEADER, instance.encode()),)
    if received_at:
        headers += ((RECEIVED_AT_HEADER, received_at),)
    head = pack_head(event)
    if head is not None:
        headers += ((KEYED_HEAD_HEADER, head),)
    return OutRecord(
        topic, partition_key(instance, event.bucket, event.key), event_json(event), headers
    )


@dataclass(slots=True, init=False)  # its __init__ compiled: see OutRecord
class KeyedEvent:
    """A keyed record read back by stage two: the fields dedupe, ordering and the output
    headers need, and the event's JSON to pass through unchanged."""

    instance: str
    id: str
    type: str
    key: str
    bucket: str | None
    provider: str
    sequencer: str | None
    time: datetime | None
    time_text: str | None
    version_only: bool | None
    raw: Mapping[str, Any] | None
    value: bytes
    etag: str | None
    """The object's ETag, which the key's state keeps for reconcile (streams.core.keystate)."""

    def __init__(
        self,
        instance: str,
        id: str,
        type: str,
        key: str,
        bucket: str | None,
        provider: str,
        sequencer: str | None,
        time: datetime | None,
        time_text: str | None,
        version_only: bool | None,
        raw: Mapping[str, Any] | None,
        value: bytes,
        etag: str | None = None,
    ) -> None:
        self.instance = instance
        self.id = id
        self.type = type
        self.key = key
        self.bucket = bucket
        self.provider = provider
        self.sequencer = sequencer
        self.time = time
        self.time_text = time_text
        self.version_only = version_only
        self.raw = raw
        self.value = value
        self.etag = etag


def parse_keyed(value: bytes, headers: Mapping[str, bytes | None]) -> KeyedEvent:
    """Inverse of keyed_record. Raises ValueError on anything else.

    A record with a `head` is read from its head alone: its value is passed through unread.
    Without one (written by the previous release, or an event whose head could not be
    packed), the event's JSON is read. Trusts what stage one wrote (no model validation per
    event) but checks every field it uses, so a foreign record is dead-lettered rather than
    misread."""
    head = headers.get(KEYED_HEAD_HEADER)
    if head is not None:
        return _parse_head(head, value, headers)
    data = orjson.loads(value)
    instance_header = headers.get(INSTANCE_HEADER)
    if instance_header is not None:
        instance = instance_header.decode()
    else:  # the first keyed format
        if not isinstance(data, dict) or not isinstance(data.get("instance"), str):
            raise ValueError("keyed record has no instance")
        instance = data["instance"]
        event = FileEvent.model_validate(data.get("event"))
        data, value = event.model_dump(mode="json"), event_json(event)
    if not isinstance(data, dict):
        raise ValueError("keyed record is not a JSON object")
    get = data.get
    event_id, kind, key, provider = get("id"), get("type"), get("key"), get("provider")
    if not (isinstance(event_id, str) and isinstance(key, str) and isinstance(provider, str)):
        raise ValueError("keyed event lacks a string id, key or provider")
    if not isinstance(kind, str) or kind not in EVENT_TYPES:
        raise ValueError(f"keyed event has type {kind!r}")
    bucket, sequencer, time_text = get("bucket"), get("sequencer"), get("time")
    version_only, raw, etag = get("version_only"), get("raw"), get("etag")
    if not (bucket is None or isinstance(bucket, str)) or not (
        sequencer is None or isinstance(sequencer, str)
    ):
        raise ValueError("keyed event's bucket or sequencer is not a string")
    if not (version_only is None or isinstance(version_only, bool)):
        raise ValueError("keyed event's version_only is not a boolean")
    time: datetime | None = None
    if time_text is not None:
        if not isinstance(time_text, str):
            raise ValueError("keyed event's time is not a string")
        time = datetime.fromisoformat(time_text)
        if time.tzinfo is None:
            raise ValueError("keyed event's time has no timezone")
    return KeyedEvent(
        instance=instance,
        id=event_id,
        type=kind,
        key=key,
        bucket=bucket,
        provider=provider,
        sequencer=sequencer,
        time=time,
        time_text=time_text,
        version_only=version_only,
        raw=raw if isinstance(raw, dict) else None,
        value=value,
        etag=etag if isinstance(etag, str) else None,
    )


def _parse_head(head: bytes, value: bytes, headers: Mapping[str, bytes | None]) -> KeyedEvent:
    """The KeyedEvent of a record with a `head` header; ValueError when it is unreadable."""
    instance_header = headers.get(INSTANCE_HEADER)
    if instance_header is None:
        raise ValueError("keyed record has a head but no instance")
    fields = unpack_head(head)
    if fields.type not in EVENT_TYPES:
        raise ValueError(f"keyed event has type {fields.type!r}")
    time_text = fields.time
    time: datetime | None = None
    if time_text is not None:
        time = datetime.fromisoformat(time_text)
        if time.tzinfo is None:
            raise ValueError("keyed event's time has no timezone")
    return KeyedEvent(
        instance=instance_header.decode(),
        id=fields.id,
        type=fields.type,
        key=fields.key,
        bucket=fields.bucket,
        provider=fields.provider,
        sequencer=fields.sequencer,
        time=time,
        time_text=time_text,
        version_only=fields.version_only,
        raw=fields.raw,
        value=value,
        etag=fields.etag,
    )


def event_json(event: FileEvent) -> bytes:
    """The event's JSON, byte for byte what pydantic's `model_dump_json` writes, by orjson:
    pydantic off the per-event path (a typical S3 event: about 6x faster, side by side).

    What orjson refuses (an integer beyond 64 bits in `raw`, a lone surrogate) is written by
    pydantic, as before. tests/normalizers hold the two equal for every event their property
    tests draw."""
    fields = event.__dict__
    time = fields["time"]
    try:
        if time is None or time.tzinfo is UTC:  # as the model keeps it: orjson writes it so
            return orjson.dumps(fields, option=orjson.OPT_UTC_Z)
        return orjson.dumps({**fields, "time": format_time(time)})
    except (TypeError, orjson.JSONEncodeError):
        return event.model_dump_json().encode()


@functools.lru_cache(maxsize=8)
def _ce_type(kind: str) -> tuple[str, bytes]:
    return ("ce_type", f"{CE_TYPE_PREFIX}{kind}".encode())


@functools.lru_cache(maxsize=1024)
def _ce_source(instance: str, provider: str) -> tuple[str, bytes]:
    return ("ce_source", f"/storage-events/{instance}/{provider}".encode())


def cloudevent_headers(
    instance: str, event_id: str, kind: str, provider: str, key: str, time_text: str | None
) -> Headers:
    """CloudEvents 1.0 Kafka protocol binding, binary mode. The headers every event of a
    type or of an instance and provider shares are built once (`_ce_type`, `_ce_source`)."""
    headers: Headers = (
        ("ce_specversion", CE_SPECVERSION_BYTES),
        ("ce_id", event_id.encode()),
        _ce_type(kind),
        _ce_source(instance, provider),
        ("ce_subject", key.encode()),
        ("ce_dataschema", CE_DATASCHEMA_BYTES),
        ("content-type", b"application/json"),
    )
    if time_text is not None:
        headers += (("ce_time", time_text.encode()),)
    return headers


def _event_headers(event: FileEvent, instance: str) -> Headers:
    time_text = format_time(event.time) if event.time is not None else None
    return cloudevent_headers(instance, event.id, event.type, event.provider, event.key, time_text)


def _keyed_headers(event: KeyedEvent) -> Headers:
    return cloudevent_headers(
        event.instance, event.id, event.type, event.provider, event.key, event.time_text
    )


def output_record(topic: str, instance: str, event: FileEvent) -> OutRecord:
    return OutRecord(topic, event.key.encode(), event_json(event), _event_headers(event, instance))


def stale_record(topic: str, instance: str, event: FileEvent, reason: str) -> OutRecord:
    headers = (*_event_headers(event, instance), ("stale.reason", reason.encode()))
    return OutRecord(topic, event.key.encode(), event_json(event), headers)


def keyed_output_record(topic: str, event: KeyedEvent) -> OutRecord:
    """The output record of a keyed event: its JSON as stage one wrote it."""
    return OutRecord(topic, event.key.encode(), event.value, _keyed_headers(event))


def keyed_stale_record(topic: str, event: KeyedEvent, reason: str) -> OutRecord:
    headers = (*_keyed_headers(event), ("stale.reason", reason.encode()))
    return OutRecord(topic, event.key.encode(), event.value, headers)


BATCH_HEADER_BYTES = 61
"""A v2 record batch's header: base offset to record count."""
RECORD_FRAMING_BYTES = 5 + 1 + 10 + 5 + 5 + 5 + 5
"""A record's own fields at their longest: length, attributes, timestamp delta, offset delta,
key length, value length, header count (varints)."""
HEADER_FRAMING_BYTES = 5 + 5
"""A header's name and value lengths (varints)."""
STALE_REASON_BYTES = 4096
"""Room for a stale record's `stale.reason` header: the event's sequencer and the id of the
event that made it stale, each bounded (streams.core.normalizers.MAX_TOKEN_BYTES, MAX_ID_BYTES),
and a sentence."""


def record_bytes(
    key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes]]
) -> int:
    """At least the size of a record batch (uncompressed) holding only this record."""
    size = BATCH_HEADER_BYTES + RECORD_FRAMING_BYTES + len(key or b"") + len(value or b"")
    for name, header_value in headers:
        size += HEADER_FRAMING_BYTES + len(name.encode()) + len(header_value or b"")
    return size


def out_record_bytes(record: OutRecord) -> int:
    return record_bytes(record.key, record.value, record.headers)


def event_record_bytes(instance: str, event: FileEvent, keyed: OutRecord) -> int:
    """The largest record `event` becomes: its keyed record, or its output or stale record
    (the key twice, as Kafka key and `ce_subject`, the id as `ce_id`, and a stale reason),
    which carry the keyed record's value unchanged. Counted without building them (it runs
    for every event): the CloudEvents headers' fixed part is measured once."""
    key_bytes = len(event.key.encode())
    output = (
        BATCH_HEADER_BYTES
        + RECORD_FRAMING_BYTES
        + 2 * key_bytes
        + len(keyed.value or b"")
        + len(event.id.encode())
        + len(instance.encode())
        + len(event.provider.encode())
        + _CE_FIXED_BYTES
    )
    stale = output + HEADER_FRAMING_BYTES + len("stale.reason") + STALE_REASON_BYTES
    return max(out_record_bytes(keyed), stale)


_CE_FIXED_BYTES = sum(
    HEADER_FRAMING_BYTES + len(name.encode()) + len(value)
    for name, value in cloudevent_headers("", "", "deleted", "", "", "0000-12-31T23:59:59.999999Z")
)
"""The CloudEvents headers without the instance, provider, id and key: their names, the
longest type and the longest RFC 3339 time."""


def dead_letter_record(
    topic: str, record: RawRecord, key: bytes | None, error: str, stage: str
) -> OutRecord:
    """The original bytes and headers, plus why and where it failed."""
    headers: list[tuple[str, bytes]] = [
        (name, value) for name, value in record.headers.items() if value is not None
    ]
    headers += [
        ("error", error.encode("utf-8", errors="replace")[:4096]),
        ("error.stage", stage.encode()),
        ("error.topic", record.topic.encode()),
    ]
    return OutRecord(topic, key, record.value, tuple(headers))


def headers_dict(
    headers: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None,
) -> dict[str, bytes | None]:
    """Kafka headers as a dict (the last value wins for a repeated name). A consumed
    record's list is taken first, without the Mapping check (an ABC's isinstance, ~0.3 µs per
    record)."""
    if headers is None:
        return {}
    if isinstance(headers, list):
        return {name: value for name, value in headers}
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {name: value for name, value in items}


def repeated_headers(
    headers: Sequence[tuple[str, bytes | None]], names: Collection[str]
) -> list[str]:
    """The headers among `names` that a raw record carries more than once: a decision must
    never read one of two values (the bridge refuses such requests; a record written to the
    raw topic directly is dead-lettered for it)."""
    seen: set[str] = set()
    repeated: list[str] = []
    for name, _ in headers:
        if name in names:
            if name in seen and name not in repeated:
                repeated.append(name)
            seen.add(name)
    return repeated


def json_line(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
