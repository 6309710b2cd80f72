"""The Kafka records the stream reads and writes, as plain data (no I/O here).

* Raw record (bridges -> `files.raw`): value = the provider's bytes exactly as delivered;
  headers `source`, optional `transport`, `delivery-id`, `received-at`,
  `header.<lower-case http header>`, `attribute.<pub/sub attribute>`; key free.
* Keyed record (normalize -> repartition topic): key = `<instance>/<bucket>/<key>` so every copy
  of one change and every change of one key land on one partition; value = JSON
  `{"instance": ..., "event": {...}}`.
* Output record (-> `files.events.<instance>`): key = the caller-facing key, value = the
  canonical event as JSON, CloudEvents 1.0 binary-mode headers.
* Stale record (-> `files.stale.<instance>`): the event, plus `stale.reason` headers.
* Dead-letter record (-> `files.dead-letter`): original bytes and headers, plus `error`
  and `error.stage`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streams.delivery import Delivery
from streams.event import FileEvent, format_time

Headers = tuple[tuple[str, bytes], ...]

CE_SPECVERSION = "1.0"
CE_TYPE_PREFIX = "storage.object."
HEADER_PREFIX = "header."
ATTRIBUTE_PREFIX = "attribute."


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record to produce."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    partition: int | None = None
    """Set only where the partition is dictated (changelog records); else by key."""


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record read from a raw topic."""

    topic: str
    value: bytes
    headers: Mapping[str, bytes] = field(default_factory=dict)


def header_text(headers: Mapping[str, bytes], name: str) -> str | None:
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


def keyed_record(
    topic: str, instance: str, event: FileEvent, received_at: bytes | None
) -> OutRecord:
    value = json.dumps(
        {"instance": instance, "event": event.model_dump(mode="json")},
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode()
    headers: Headers = (("received-at", received_at),) if received_at else ()
    return OutRecord(topic, partition_key(instance, event.bucket, event.key), value, headers)


def parse_keyed_value(value: bytes) -> tuple[str, FileEvent]:
    """Inverse of keyed_record's value. Raises ValueError on anything else."""
    data = json.loads(value)
    if not isinstance(data, dict) or not isinstance(data.get("instance"), str):
        raise ValueError("keyed record has no instance")
    return data["instance"], FileEvent.model_validate(data.get("event"))


def event_json(event: FileEvent) -> bytes:
    return event.model_dump_json().encode()


def cloudevent_headers(event: FileEvent, instance: str) -> Headers:
    """CloudEvents 1.0 Kafka protocol binding, binary mode."""
    headers: list[tuple[str, bytes]] = [
        ("ce_specversion", CE_SPECVERSION.encode()),
        ("ce_id", event.id.encode()),
        ("ce_type", f"{CE_TYPE_PREFIX}{event.type}".encode()),
        ("ce_source", f"/storage-events/{instance}/{event.provider}".encode()),
        ("ce_subject", event.key.encode()),
        ("content-type", b"application/json"),
    ]
    if event.time is not None:
        headers.append(("ce_time", format_time(event.time).encode()))
    return tuple(headers)


def output_record(topic: str, instance: str, event: FileEvent) -> OutRecord:
    return OutRecord(
        topic, event.key.encode(), event_json(event), cloudevent_headers(event, instance)
    )


def stale_record(topic: str, instance: str, event: FileEvent, reason: str) -> OutRecord:
    headers = (*cloudevent_headers(event, instance), ("stale.reason", reason.encode()))
    return OutRecord(topic, event.key.encode(), event_json(event), headers)


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
    headers: Iterable[tuple[str, bytes]] | Mapping[str, bytes] | None,
) -> dict[str, bytes]:
    """Kafka headers as a dict (the last value wins for a repeated name)."""
    if headers is None:
        return {}
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {name: value for name, value in items}


def json_line(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
