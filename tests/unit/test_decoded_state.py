"""streams.core.keystate.Decoded: key records kept decoded across the emit stage's batches.

A memo of `decode`: a plan made with it is the plan made without it, batch after batch (hot
keys spilling, deletes, duplicates, stale events, several instances and scopes), whatever its
size; every reader gets its own copy; and records written by the code before it (the same
JSON) read as they did.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from streams.config import Settings
from streams.core.emitting import KEYS, EmitPlan, KeyedInput, plan_batch
from streams.core.event import FileEvent
from streams.core.keystate import Decoded, KeyState, decode, encode
from streams.core.ordering import Mark
from streams.core.records import keyed_record

NOW = 1_800_000_000.0
SETTINGS = Settings.model_validate(
    {
        "instances": [
            {"name": "a", "dedupe_ttl": "60s"},
            {"name": "b", "dedupe_ttl": "1h", "sources": ["gcs", "reconcile"]},
        ]
    }
)
REPARTITION = SETTINGS.stream.repartition_topic


class MemoryState:
    def __init__(self) -> None:
        self.data: dict[tuple[str, int, bytes], bytes] = {}

    def get(self, table: str, partition: int, key: bytes) -> bytes | None:
        return self.data.get((table, partition, key))

    def apply(self, plan: EmitPlan) -> None:
        for (table, partition), values in plan.writes.items():
            for key, value in values.items():
                self.data[(table, partition, key)] = value


def random_events(rng: random.Random, count: int) -> list[tuple[FileEvent, str]]:
    events: list[tuple[FileEvent, str]] = []
    base = datetime(2026, 11, 30, tzinfo=UTC)
    for n in range(count):
        key = f"k/{rng.randrange(6)}"
        provider = rng.choice(["s3", "gcs", "reconcile", "b2"])
        number = rng.randrange(40)
        kind = rng.choice(["created", "created", "deleted"])
        fields: dict[str, Any] = {
            "id": f"{provider}:{number}" if provider != "b2" else f"b2-{number}",
            "type": kind,
            "key": key,
            "bucket": "uploads",
            "time": base + timedelta(seconds=number),
            "provider": provider,
            "etag": f"e{number}",
            "raw": {"instance": "b"} if provider == "reconcile" else {},
        }
        if provider == "s3":
            fields["sequencer"] = f"{number:04X}"
        elif provider == "gcs":
            fields["sequencer"] = str(10**20 + number)  # past 64 bits: json, not orjson
        if kind == "deleted" and rng.random() < 0.3:
            fields["version_only"] = True
        instance = "b" if provider in ("gcs", "reconcile") else "a"
        events.append((FileEvent(**fields), instance))
        if rng.random() < 0.2:
            events.append(events[-1])  # a redelivery
        if n % 7 == 0 and len(events) > 2:
            events.append(events[-3])  # an older change again
    return events


def keyed(item: FileEvent, instance: str, partition: int) -> KeyedInput:
    record = keyed_record(REPARTITION, instance, item, None)
    assert record.value is not None
    return KeyedInput(REPARTITION, partition, record.key, record.value, dict(record.headers))


def summary(plan: EmitPlan) -> tuple[object, ...]:
    return (
        dict(plan.outcomes),
        [(r.topic, r.key, r.value, r.headers) for r in plan.outputs],
        plan.writes,
    )


@pytest.mark.parametrize("size", [1, 3, 1000])
@pytest.mark.parametrize("seed", range(4))
def test_a_plan_with_records_kept_decoded_is_the_plan_without(size: int, seed: int) -> None:
    rng = random.Random(seed)
    events = random_events(rng, 300)
    plain, kept = MemoryState(), MemoryState()
    decoded = Decoded(size)
    now = NOW
    for start in range(0, len(events), 9):
        batch = [keyed(item, instance, 0) for item, instance in events[start : start + 9]]
        now += rng.choice([0.0, 1.0, 30.0, 70.0])  # ids expire between some batches
        without = plan_batch(batch, SETTINGS, plain, now)
        with_memo = plan_batch(batch, SETTINGS, kept, now, decoded=decoded)
        assert summary(with_memo) == summary(without)
        plain.apply(without)
        kept.apply(with_memo)
    assert len(decoded.states) <= size
    assert plain.data == kept.data


def test_each_reader_gets_its_own_copy() -> None:
    mark = Mark("aws-sequencer", ("0005".ljust(64, "0"),), NOW - 5, "s3:5", "created")
    stored = encode(KeyState(mark, [["s3:5", NOW + 60]], "e"))
    decoded = Decoded()
    first = decoded.decode(stored)
    first.remember("s3:6", False, NOW + 61, NOW)
    first.mark = None
    first.etag = "changed"
    assert decoded.decode(stored) == decode(stored)
    written = decoded.encode(first)
    first.forget("s3:6", False)
    assert decoded.decode(written) == decode(written)


def test_records_written_before_are_read_as_they_were() -> None:
    """The format is the previous release's JSON: its records (as it wrote them, including
    a GCS generation past 64 bits and a reconcile id) read alike through the memo."""
    written_before = [
        b'{"m":{"kind":"aws-sequencer","token":["0005000000000000000000000000000000000000000000'
        b'000000000000000000"],"time":1700000000.0,"id":"s3:5","type":"created"},"e":"e",'
        b'"i":[["s3:5",1800000060.0],["r",1800000070.0,1]]}',
        b'{"m":{"kind":"gcs-generation","token":[1180591620717411303424,2,1],"time":null,'
        b'"id":"gcs:x","type":"deleted","forget_at":1800000005.0},"x":1800000005.0}',
        b'{"i":[["b2-id",1800000060.0]],"s":1800000090.0,"x":1800000090.0}',
        b"not json",
    ]
    decoded = Decoded()
    for stored in written_before:
        assert decoded.decode(stored) == decode(stored)
        assert decoded.decode(stored) == decode(stored)  # kept
    assert decoded.decode(None) == KeyState()


def test_the_stage_s_plan_writes_one_record_per_key_with_or_without_the_memo() -> None:
    item = FileEvent(id="s3:1", type="created", key="k", bucket="b", provider="s3", sequencer="01")
    state = MemoryState()
    decoded = Decoded()
    first = plan_batch([keyed(item, "a", 0)], SETTINGS, state, NOW, decoded=decoded)
    state.apply(first)
    assert len([key for key in first.writes[(KEYS, 0)] if not key.startswith(b"\x00")]) == 1
    again = plan_batch([keyed(item, "a", 0)], SETTINGS, state, NOW + 1, decoded=decoded)
    assert dict(again.outcomes) == {("a", "duplicate"): 1}


@pytest.mark.parametrize("size", [1, 2, 5, 64])
def test_the_memo_keeps_the_last_records_up_to_its_size(size: int) -> None:
    """Records stream through it: never more than `size` kept, the newest ones, each read
    back as `decode` reads it."""
    decoded = Decoded(size)
    records = [encode(KeyState(None, [[f"id-{n}", NOW + n]], f"e{n}")) for n in range(10 * size)]
    for stored in records:
        assert decoded.decode(stored) == decode(stored)
        assert len(decoded.states) <= size
    assert list(decoded.states) == records[-size:]
    for stored in records[-size:]:
        assert decoded.decode(stored) == decode(stored)
