"""Stage two, pure: keyed events become output, stale or nothing (duplicates), per batch.

Runs on the repartition topic, so every copy of one change and every change of one key is in
one partition and handled in order. For each event, in order:

1. Dedupe on (instance, event.id): an id seen less than the instance's TTL ago is a
   duplicate. The expiry is written once, when the id is first handled, and never extended,
   so neither a redelivery nor a state restore gives an id a fresh lease.
2. Order per (instance, key): an event older than the last one emitted for its key goes to
   the stale topic with the reason (see streams.ordering); a `deleted` that removed only a
   noncurrent version is emitted but does not move the key's mark, since the key lives on.
3. Otherwise it is emitted.

The plan holds the records to send and the state to record once Kafka acknowledged them:
a batch that fails to send records nothing, so its redelivery runs again.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from streams.config import Settings
from streams.ordering import Mark, mark_for, staleness
from streams.records import (
    KeyedEvent,
    OutRecord,
    RawRecord,
    dead_letter_record,
    keyed_output_record,
    keyed_stale_record,
    parse_keyed,
    partition_key,
)

SEEN = "seen"
MARKS = "marks"


@dataclass(frozen=True, slots=True)
class KeyedInput:
    """One record read from the repartition topic."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes
    headers: Mapping[str, bytes] = field(default_factory=dict)
    offset: int = -1


class StateReader(Protocol):
    """Read access to the co-partitioned state tables."""

    def get(self, table: str, partition: int, key: bytes) -> bytes | None: ...


class PendingState:
    """State as plans not applied yet will leave it: their writes, newest first, then `state`.

    Lets the next batch of a partition be planned while the previous one is still being
    written to Kafka."""

    def __init__(self, state: StateReader, pending: Sequence[EmitPlan]) -> None:
        self.state = state
        self.writes = [plan.writes for plan in reversed(pending)]

    def get(self, table: str, partition: int, key: bytes) -> bytes | None:
        for writes in self.writes:
            items = writes.get((table, partition))
            if items is not None and key in items:
                return items[key]
        return self.state.get(table, partition, key)


@dataclass(slots=True)
class EmitPlan:
    outputs: list[OutRecord] = field(default_factory=list)
    writes: dict[tuple[str, int], dict[bytes, bytes]] = field(default_factory=dict)
    """(table, partition) -> key -> value, to record after the outputs are acknowledged."""
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(instance, emitted|duplicate|stale|dead_letter) -> count"""
    received_at: list[tuple[str, bytes]] = field(default_factory=list)
    """(instance, received-at header) of every emitted event, for latency metrics."""

    def write(self, table: str, partition: int, key: bytes, value: bytes) -> None:
        self.writes.setdefault((table, partition), {})[key] = value


def seen_key(instance: str, event_id: str) -> bytes:
    return f"{instance}/{event_id}".encode()


def mark_key(instance: str, event: KeyedEvent) -> bytes:
    """Ordering state is per object: (instance, bucket, key), like the repartition key."""
    return partition_key(instance, event.bucket, event.key)


def encode_expiry(expires_at: float) -> bytes:
    return f"{expires_at:.3f}".encode()


def decode_expiry(value: bytes | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def plan_batch(
    inputs: Sequence[KeyedInput], settings: Settings, state: StateReader, now: float
) -> EmitPlan:
    """Decide every event of a batch; `now` (epoch seconds) only ages dedupe entries."""
    plan = EmitPlan()
    pending: dict[tuple[str, int, bytes], bytes] = {}
    instances = {instance.name: instance for instance in settings.instances}

    def lookup(table: str, partition: int, key: bytes) -> bytes | None:
        found = pending.get((table, partition, key))
        return found if found is not None else state.get(table, partition, key)

    def record(table: str, partition: int, key: bytes, value: bytes) -> None:
        pending[(table, partition, key)] = value
        plan.write(table, partition, key, value)

    for item in inputs:
        instance_name = "?"
        try:
            event = parse_keyed(item.value, item.headers)
            instance_name = event.instance
            instance = instances[instance_name]
        except (ValueError, KeyError) as exc:
            reason = f"unreadable keyed record: {exc}"
            if isinstance(exc, KeyError):
                reason = f"instance {exc} is no longer configured"
            raw = RawRecord(item.topic, item.value, item.headers)
            plan.outputs.append(
                dead_letter_record(settings.stream.dead_letter_topic, raw, item.key, reason, "emit")
            )
            plan.outcomes[(instance_name, "dead_letter")] += 1
            continue

        id_key = seen_key(instance.name, event.id)
        expires_at = decode_expiry(lookup(SEEN, item.partition, id_key))
        if expires_at is not None and expires_at > now:
            plan.outcomes[(instance.name, "duplicate")] += 1
            continue
        record(SEEN, item.partition, id_key, encode_expiry(now + instance.dedupe_ttl))

        key_key = mark_key(instance.name, event)
        stored = lookup(MARKS, item.partition, key_key)
        last = _read_mark(stored)
        stale_reason = staleness(event, last)
        if stale_reason is not None:
            plan.outputs.append(
                keyed_stale_record(instance.stale_output_topic, event, stale_reason)
            )
            plan.outcomes[(instance.name, "stale")] += 1
            continue
        if not _version_only(event):
            record(MARKS, item.partition, key_key, _mark_bytes(mark_for(event)))
        plan.outputs.append(keyed_output_record(instance.output_topic, event))
        plan.outcomes[(instance.name, "emitted")] += 1
        received_at = item.headers.get("received-at")
        if received_at:
            plan.received_at.append((instance.name, received_at))
    return plan


def _read_mark(stored: bytes | None) -> Mark | None:
    """The stored mark; an unreadable one counts as none (unknown order passes)."""
    if stored is None:
        return None
    try:
        data = _loads(stored)
        return Mark.from_json(data) if isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None


def _mark_bytes(mark: Mark) -> bytes:
    try:
        return orjson.dumps(mark.to_json())
    except TypeError:  # orjson stops at 64-bit integers; a GCS token may be longer
        return json.dumps(mark.to_json()).encode()


def _loads(stored: bytes) -> object:
    try:
        return orjson.loads(stored)
    except orjson.JSONDecodeError:
        return json.loads(stored)  # integers past 64 bits, which only json reads


def _version_only(event: KeyedEvent) -> bool:
    return event.type == "deleted" and event.version_only is True
