"""streams.core.emitting.plan_batch: dedupe, per-key order and output records, against in-memory
state.

`MemoryState` is a plain implementation of the StateReader protocol (the state interface, not
Kafka); applying a plan's `writes` to it is what the worker does once Kafka acknowledged the
batch's outputs. A key's state is one `keys` record (streams.core.keystate: its mark, recent ids
and ETag), decoded here to say what the plan recorded; `seen` holds a hot key's spilled ids and
the ids recorded before per-key state, read in the upgrade window (`SEEN_UNTIL_KEY`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from streams.config import Settings
from streams.core.emitting import (
    KEYS,
    LEGACY_UNTIL_KEY,
    MARKS,
    SEEN,
    SEEN_UNTIL_KEY,
    EmitPlan,
    KeyedInput,
    PendingState,
    dedupe_key,
    encode_expiry,
    mark_key,
    migrated_mark,
    plan_batch,
    seen_key,
    spill_key,
    unrecord,
)
from streams.core.event import FileEvent
from streams.core.keystate import (
    FORGETTABLE_MARKER,
    RECENT_IDS,
    KeyState,
    decode,
    encode,
    record_forget_at,
)
from streams.core.ordering import Mark, mark_for
from streams.core.records import KeyedEvent, OutRecord, keyed_record, parse_keyed
from streams.engine.store import OFFSET_KEY

NOW = 1_800_000_000.0
SETTINGS = Settings.model_validate(
    {
        "instances": [
            {"name": "a", "dedupe_ttl": "60s"},
            {"name": "b", "dedupe_ttl": "1h", "topic": "out.b", "stale_topic": "late.b"},
        ]
    }
)
REPARTITION = SETTINGS.stream.repartition_topic
DEAD_LETTER = SETTINGS.stream.dead_letter_topic


class MemoryState:
    """(table, partition, key) -> value."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, int, bytes], bytes] = {}

    def get(self, table: str, partition: int, key: bytes) -> bytes | None:
        return self.data.get((table, partition, key))

    def put(self, table: str, partition: int, key: bytes, value: bytes) -> None:
        self.data[(table, partition, key)] = value

    def apply(self, plan: EmitPlan) -> None:
        for (table, partition), values in plan.writes.items():
            for key, value in values.items():
                self.put(table, partition, key, value)


def event(sequencer: str = "0055AED6DCD90281E5", **fields: Any) -> FileEvent:
    values: dict[str, Any] = {
        "id": f"s3:{sequencer}",
        "type": "created",
        "key": "photos/red flower.jpg",
        "bucket": "uploads",
        "size": 1024,
        "etag": "d41d8cd98f00b204e9800998ecf8427e",
        "time": datetime(2026, 11, 30, 0, 8, 7, tzinfo=UTC),
        "sequencer": sequencer,
        "provider": "s3",
        "raw": {"eventName": "ObjectCreated:Put"},
    }
    return FileEvent(**(values | fields))


def keyed(
    item: FileEvent, instance: str = "a", partition: int = 0, received_at: bytes | None = None
) -> KeyedInput:
    record = keyed_record(REPARTITION, instance, item, received_at)
    assert record.value is not None
    return KeyedInput(REPARTITION, partition, record.key, record.value, dict(record.headers))


def plan(inputs: list[KeyedInput], state: MemoryState | None = None, now: float = NOW) -> EmitPlan:
    return plan_batch(inputs, SETTINGS, state if state is not None else MemoryState(), now)


def headers(record: OutRecord) -> dict[str, bytes]:
    names = [name for name, _ in record.headers]
    assert len(names) == len(set(names)), names
    return dict(record.headers)


def only(records: list[OutRecord]) -> OutRecord:
    assert len(records) == 1, records
    return records[0]


MARKERS = (LEGACY_UNTIL_KEY, SEEN_UNTIL_KEY)
S3_KEY = mark_key("a", event(), "s3")
"""The `keys` record of `event()`'s key in instance `a`."""


def event_writes(result: EmitPlan) -> dict[tuple[str, int], dict[bytes, bytes]]:
    """The plan's writes without the partition's upgrade-window markers (written once)."""
    found = {
        place: {key: value for key, value in items.items() if key not in MARKERS}
        for place, items in result.writes.items()
    }
    return {place: items for place, items in found.items() if items}


def written(result: EmitPlan, key: bytes, partition: int = 0) -> KeyState:
    """The `keys` record the plan writes for `key`, decoded."""
    stored = result.writes[(KEYS, partition)][key]
    return decode(stored)


def stored(state: MemoryState, key: bytes, partition: int = 0) -> KeyState:
    value = state.get(KEYS, partition, key)
    assert value is not None, key
    return decode(value)


def id_list(current: KeyState) -> list[str]:
    return [entry[0] for entry in current.ids]


def upgraded(state: MemoryState, partition: int = 0) -> MemoryState:
    """Make `partition` look like one that had state before per-key state (its `seen` changelog
    offset key set), so its first plan opens the `seen` window (`SEEN_UNTIL_KEY`)."""
    state.put(SEEN, partition, OFFSET_KEY, b"41")
    return state


def parsed(item: FileEvent, instance: str = "a") -> KeyedEvent:
    record = keyed(item, instance)
    return parse_keyed(record.value, record.headers)


def outcomes(result: EmitPlan) -> dict[tuple[str, str], int]:
    return dict(result.outcomes)


# --- emitted records -------------------------------------------------------------------------


def test_an_event_is_emitted_with_cloudevents_headers() -> None:
    item = event()
    result = plan([keyed(item)])
    record = only(result.outputs)
    assert record.topic == "files.events.a"
    assert record.key == b"photos/red flower.jpg"
    assert record.value is not None
    assert json.loads(record.value) == item.model_dump(mode="json")
    assert json.loads(record.value)["time"] == "2026-11-30T00:08:07Z"
    assert headers(record) == {
        "ce_specversion": b"1.0",
        "ce_id": item.id.encode(),
        "ce_type": b"storage.object.created",
        "ce_source": b"/storage-events/a/s3",
        "ce_subject": b"photos/red flower.jpg",
        "ce_time": b"2026-11-30T00:08:07Z",
        "ce_dataschema": b"urn:storage-events:schema:file-event:v1",
        "content-type": b"application/json",
    }
    assert outcomes(result) == {("a", "emitted"): 1}


def test_deleted_event_type_and_no_time() -> None:
    item = event(type="deleted", time=None, key="d\u00e9j\u00e0 vu.txt")
    record = only(plan([keyed(item)]).outputs)
    found = headers(record)
    assert found["ce_type"] == b"storage.object.deleted"
    assert found["ce_subject"] == "d\u00e9j\u00e0 vu.txt".encode()
    assert record.key == "d\u00e9j\u00e0 vu.txt".encode()
    assert "ce_time" not in found


def test_instance_decides_topic_and_source() -> None:
    record = only(plan([keyed(event(provider="minio"), "b")]).outputs)
    assert record.topic == "out.b"
    assert headers(record)["ce_source"] == b"/storage-events/b/minio"


def test_writes_record_the_id_expiry_and_the_key_mark() -> None:
    item = event()
    result = plan([keyed(item, partition=3)])
    # One `keys` record for the key, and the partition's two window markers: nothing in the
    # tables of the earlier layouts.
    assert set(result.writes) == {(KEYS, 3)}
    assert set(result.writes[(KEYS, 3)]) == {S3_KEY, LEGACY_UNTIL_KEY, SEEN_UNTIL_KEY}
    current = written(result, S3_KEY, 3)
    assert current.ids == [[item.id, NOW + 60]]
    assert current.etag == item.etag == "d41d8cd98f00b204e9800998ecf8427e"
    assert current.spill_until is None
    mark = current.mark
    assert mark is not None
    assert (mark.kind, mark.event_id, mark.type) == ("aws-sequencer", item.id, "created")
    # A live key's record has no end; a fresh partition's windows close at once.
    assert FORGETTABLE_MARKER not in result.writes[(KEYS, 3)][S3_KEY]
    assert result.writes[(KEYS, 3)][SEEN_UNTIL_KEY] == encode_expiry(NOW)
    assert result.writes[(KEYS, 3)][LEGACY_UNTIL_KEY] == encode_expiry(NOW)


def test_received_at_is_reported_for_emitted_events_only() -> None:
    item = event()
    result = plan([keyed(item, received_at=b"1700"), keyed(item, received_at=b"1701")])
    assert result.received_at == [("a", b"1700")]


# --- dedupe --------------------------------------------------------------------------------------


def test_duplicate_within_one_batch() -> None:
    item = event()
    result = plan([keyed(item), keyed(item)])
    assert len(result.outputs) == 1
    assert outcomes(result) == {("a", "emitted"): 1, ("a", "duplicate"): 1}


def test_duplicate_across_batches() -> None:
    state = MemoryState()
    item = event()
    first = plan([keyed(item)], state)
    state.apply(first)
    second = plan([keyed(item)], state, NOW + 10)
    assert second.outputs == []
    assert outcomes(second) == {("a", "duplicate"): 1}
    assert second.writes == {}  # a duplicate does not renew the id's lease


def test_same_id_in_two_instances_is_not_a_duplicate() -> None:
    item = event()
    result = plan([keyed(item, "a"), keyed(item, "b")])
    assert [record.topic for record in result.outputs] == ["files.events.a", "out.b"]
    assert outcomes(result) == {("a", "emitted"): 1, ("b", "emitted"): 1}


def test_different_ids_of_one_key_are_not_duplicates() -> None:
    result = plan([keyed(event("0001")), keyed(event("0002"))])
    assert outcomes(result) == {("a", "emitted"): 2}


@pytest.mark.parametrize("where", ["record", "seen before per-key state"])
@pytest.mark.parametrize(
    ("stored_expiry", "duplicate"),
    [(NOW + 0.001, True), (NOW + 59, True), (NOW, False), (NOW - 1, False)],
)
def test_expiry_is_honoured(stored_expiry: float, duplicate: bool, where: str) -> None:
    """An id counts until its expiry, whether in its key's record or (in the upgrade window)
    in `seen`, where the two-table layout recorded it."""
    item = event()
    state = MemoryState()
    if where == "record":
        state.put(KEYS, 0, S3_KEY, encode(KeyState(ids=[[item.id, stored_expiry]])))
    else:
        upgraded(state).put(SEEN, 0, seen_key("a", item.id), encode_expiry(stored_expiry))
    result = plan([keyed(item)], state)
    if duplicate:
        assert (result.outputs, outcomes(result)) == ([], {("a", "duplicate"): 1})
    else:
        assert outcomes(result) == {("a", "emitted"): 1}
        # A fresh lease from now, the expired entry gone from the record.
        assert written(result, S3_KEY).ids == [[item.id, NOW + 60]]


def test_the_lease_is_the_instance_ttl() -> None:
    item = event()
    result = plan([keyed(item, "b")])
    assert written(result, mark_key("b", item, "s3")).ids == [[item.id, NOW + 3600]]


def test_a_duplicate_does_not_extend_the_lease() -> None:
    state = MemoryState()
    item = event()
    state.apply(plan([keyed(item)], state, NOW))
    duplicate = plan([keyed(item)], state, NOW + 30)
    assert (outcomes(duplicate), duplicate.writes) == ({("a", "duplicate"): 1}, {})
    state.apply(duplicate)
    assert stored(state, S3_KEY).ids == [[item.id, NOW + 60]]
    again = plan([keyed(item)], state, NOW + 60)  # the original lease has run out
    assert outcomes(again) == {("a", "emitted"): 1}
    assert written(again, S3_KEY).ids == [[item.id, NOW + 120]]


def test_expired_ids_are_dropped_from_a_record_when_it_is_next_written() -> None:
    state = MemoryState()
    first, second, third = event("0001"), event("0002"), event("0003")
    state.apply(plan([keyed(first)], state, NOW))
    state.apply(plan([keyed(second)], state, NOW + 30))
    assert stored(state, S3_KEY).ids == [[first.id, NOW + 60], [second.id, NOW + 90]]
    result = plan([keyed(third)], state, NOW + 60)  # first's id has just expired
    assert written(result, S3_KEY).ids == [[second.id, NOW + 90], [third.id, NOW + 120]]


def test_an_unreadable_expiry_is_no_expiry() -> None:
    item = event()
    state = upgraded(MemoryState())  # the window is open: `seen` is read
    state.put(SEEN, 0, seen_key("a", item.id), b"not a number")
    assert outcomes(plan([keyed(item)], state)) == {("a", "emitted"): 1}


def test_an_unreadable_record_is_an_empty_one() -> None:
    """No mark (unknown order passes), no ids (nothing a duplicate); the plan writes a
    readable record over it."""
    item = event()
    state = MemoryState()
    state.put(KEYS, 0, S3_KEY, b"not a record")
    result = plan([keyed(item)], state)
    assert outcomes(result) == {("a", "emitted"): 1}
    assert written(result, S3_KEY).ids == [[item.id, NOW + 60]]


def test_state_is_read_from_the_record_partition() -> None:
    item = event()
    state = MemoryState()
    state.put(KEYS, 1, S3_KEY, encode(KeyState(ids=[[item.id, NOW + 10]])))
    assert outcomes(plan([keyed(item, partition=1)], state)) == {("a", "duplicate"): 1}
    assert outcomes(plan([keyed(item, partition=0)], state)) == {("a", "emitted"): 1}
    # The same for an id recorded before per-key state, in the partition's window.
    state = upgraded(MemoryState(), 1)
    state.put(SEEN, 1, seen_key("a", item.id), encode_expiry(NOW + 10))
    upgraded(state, 0)
    assert outcomes(plan([keyed(item, partition=1)], state)) == {("a", "duplicate"): 1}
    assert outcomes(plan([keyed(item, partition=0)], state)) == {("a", "emitted"): 1}


# --- order -----------------------------------------------------------------------------------


def test_an_older_event_goes_to_the_stale_topic() -> None:
    state = MemoryState()
    newer, older = event("0063836BDED404C9F2"), event("005A934FE6C0A58C72")
    state.apply(plan([keyed(newer)], state))
    result = plan([keyed(older)], state)
    record = only(result.outputs)
    assert record.topic == "files.stale.a"
    assert record.key == older.key.encode()
    assert record.value is not None
    assert json.loads(record.value) == older.model_dump(mode="json")
    found = headers(record)
    assert found["ce_id"] == older.id.encode()
    assert found["ce_subject"] == older.key.encode()
    reason = found["stale.reason"].decode()
    assert "aws-sequencer" in reason and newer.id in reason
    assert outcomes(result) == {("a", "stale"): 1}
    # The stale event's id is recorded (its redelivery is a duplicate); the mark, and the
    # ETag of the newest event emitted, are not moved.
    assert set(event_writes(result)) == {(KEYS, 0)}
    assert set(event_writes(result)[(KEYS, 0)]) == {S3_KEY}
    current = written(result, S3_KEY)
    assert id_list(current) == [newer.id, older.id]
    assert current.mark is not None and current.mark.event_id == newer.id
    state.apply(result)
    assert outcomes(plan([keyed(older)], state)) == {("a", "duplicate"): 1}


def test_stale_within_one_batch_and_to_the_instance_stale_topic() -> None:
    result = plan([keyed(event("0063", key="x"), "b"), keyed(event("0062", key="x"), "b")])
    assert [record.topic for record in result.outputs] == ["out.b", "late.b"]
    assert outcomes(result) == {("b", "emitted"): 1, ("b", "stale"): 1}


def test_a_stale_event_does_not_move_the_mark() -> None:
    result = plan([keyed(event("0003")), keyed(event("0001")), keyed(event("0002"))])
    assert [record.topic for record in result.outputs] == [
        "files.events.a",
        "files.stale.a",
        "files.stale.a",
    ]
    current = written(result, S3_KEY)
    assert current.mark is not None and current.mark.event_id == "s3:0003"
    assert id_list(current) == ["s3:0003", "s3:0001", "s3:0002"]


def test_keys_are_ordered_independently() -> None:
    result = plan([keyed(event("0003", key="x")), keyed(event("0001", key="y"))])
    assert outcomes(result) == {("a", "emitted"): 2}


def test_instances_are_ordered_independently() -> None:
    result = plan([keyed(event("0003"), "a"), keyed(event("0001"), "b")])
    assert outcomes(result) == {("a", "emitted"): 1, ("b", "emitted"): 1}


def test_a_newer_event_moves_the_mark() -> None:
    result = plan([keyed(event("0001")), keyed(event("0002")), keyed(event("0003"))])
    assert outcomes(result) == {("a", "emitted"): 3}
    current = written(result, S3_KEY)
    assert current.mark is not None and current.mark.event_id == "s3:0003"


def test_a_version_only_delete_is_emitted_but_does_not_move_the_mark() -> None:
    created = event("0001")
    version_gone = event("0003", type="deleted", version_id="v0", version_only=True)
    later_created = event("0002")
    result = plan([keyed(created), keyed(version_gone), keyed(later_created)])
    assert [record.topic for record in result.outputs] == ["files.events.a"] * 3
    assert headers(result.outputs[1])["ce_type"] == b"storage.object.deleted"
    current = written(result, S3_KEY)
    assert current.mark is not None and current.mark.event_id == later_created.id


def test_a_version_only_delete_alone_writes_no_mark() -> None:
    item = event("0003", type="deleted", version_only=True, etag=None)
    result = plan([keyed(item)])
    assert outcomes(result) == {("a", "emitted"): 1}
    assert set(event_writes(result)) == {(KEYS, 0)}
    current = written(result, S3_KEY)
    assert (current.mark, current.etag, current.ids) == (None, None, [[item.id, NOW + 60]])
    # A record of ids alone ends with them.
    assert record_forget_at(result.writes[(KEYS, 0)][S3_KEY]) == NOW + 60


@pytest.mark.parametrize("version_only", [False, None])
def test_a_delete_of_the_live_object_moves_the_mark(version_only: bool | None) -> None:
    deleted = event("0003", type="deleted", version_only=version_only)
    result = plan([keyed(deleted), keyed(event("0002"))])
    assert [record.topic for record in result.outputs] == ["files.events.a", "files.stale.a"]


def test_a_version_only_delete_older_than_the_mark_is_stale() -> None:
    result = plan([keyed(event("0003")), keyed(event("0002", type="deleted", version_only=True))])
    assert outcomes(result) == {("a", "emitted"): 1, ("a", "stale"): 1}


def test_gcs_event_with_a_strange_metageneration_is_emitted() -> None:
    # Used to raise ValueError out of plan_batch (int("²")), stopping the worker on every
    # restart since the record is read again.
    item = event(provider="gcs", sequencer="12", raw={"metageneration": "\u00b2"}, id="gcs:weird")
    result = plan([keyed(item), keyed(event(provider="gcs", sequencer="11", id="gcs:old"))])
    assert outcomes(result) == {("a", "emitted"): 1, ("a", "stale"): 1}


# --- dead letters ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b"\xff\xfe",
        b"[]",
        b'{"event": {}}',
        b'{"instance": 3, "event": {}}',
        b'{"instance": "a"}',
        b'{"instance": "a", "event": {"id": "x"}}',
        b'{"instance": "a", "event": {"id": "x", "type": "moved", "key": "k", "provider": "s3"}}',
    ],
)
def test_unreadable_keyed_record_is_dead_lettered(value: bytes) -> None:
    item = KeyedInput(REPARTITION, 2, b"a/k", value, {"received-at": b"1700"})
    result = plan([item])
    record = only(result.outputs)
    assert record.topic == DEAD_LETTER
    assert (record.key, record.value) == (b"a/k", value)
    found = headers(record)
    assert found["received-at"] == b"1700"
    assert found["error.stage"] == b"emit"
    assert found["error.topic"] == REPARTITION.encode()
    assert found["error"].startswith(b"unreadable keyed record")
    assert outcomes(result) == {("?", "dead_letter"): 1}
    assert result.writes == {}


def test_unknown_instance_is_dead_lettered() -> None:
    item = keyed(event(), "gone")
    result = plan([item])
    record = only(result.outputs)
    assert record.topic == DEAD_LETTER
    assert (record.key, record.value) == (item.key, item.value)
    found = headers(record)
    assert found["error.stage"] == b"emit"
    assert b"'gone'" in found["error"] and b"no longer configured" in found["error"]
    assert result.writes == {}


def test_the_batch_goes_on_after_a_dead_letter() -> None:
    result = plan([KeyedInput(REPARTITION, 0, None, b"{}"), keyed(event())])
    assert [record.topic for record in result.outputs] == [DEAD_LETTER, "files.events.a"]
    assert outcomes(result) == {("?", "dead_letter"): 1, ("a", "emitted"): 1}


def test_a_batch_planned_while_the_previous_one_is_unwritten_sees_its_state() -> None:
    """The worker plans a partition's next batch before the previous batch's state is in
    the store: PendingState must make that plan the same as after the write."""
    store = MemoryState()
    newer, older = event("0055AED6DCD90281F0"), event("0055AED6DCD90281E5")
    first = plan([keyed(newer)], store)
    assert outcomes(first) == {("a", "emitted"): 1}

    second_batch = [keyed(newer), keyed(older), keyed(event("0055AED6DCD9028200"))]
    ahead = plan_batch(second_batch, SETTINGS, PendingState(store, [first]), NOW)
    store.apply(first)
    after = plan_batch(second_batch, SETTINGS, store, NOW)

    assert (
        outcomes(ahead)
        == outcomes(after)
        == {
            ("a", "duplicate"): 1,
            ("a", "stale"): 1,
            ("a", "emitted"): 1,
        }
    )
    assert ahead.outputs == after.outputs
    assert ahead.writes == after.writes


def test_pending_state_reads_the_newest_pending_write_first() -> None:
    store = MemoryState()
    store.put(SEEN, 0, b"k", b"stored")
    older, newer = EmitPlan(), EmitPlan()
    older.write(SEEN, 0, b"k", b"older")
    newer.write(SEEN, 0, b"k", b"newer")
    newer.write(MARKS, 1, b"m", b"mark")
    assert PendingState(store, [older, newer]).get(SEEN, 0, b"k") == b"newer"
    assert PendingState(store, [older]).get(SEEN, 0, b"k") == b"older"
    assert PendingState(store, []).get(SEEN, 0, b"k") == b"stored"
    assert PendingState(store, [older, newer]).get(MARKS, 0, b"m") is None
    assert PendingState(store, [older, newer]).get(MARKS, 1, b"m") == b"mark"


# --- scopes: one provider's deliveries never decide about another's ---------------------------


def other(provider: str, sequencer: str | None = None, **fields: Any) -> FileEvent:
    """An event of another provider for the same bucket and key as `event()`."""
    values: dict[str, Any] = {"provider": provider, "sequencer": sequencer, "raw": {}}
    return event(**(values | fields))


def test_a_minio_sequencer_of_fs_does_not_make_the_next_s3_change_stale() -> None:
    state = MemoryState()
    state.apply(plan([keyed(event("0055AED6DCD90281E5"))], state))
    attack = other("minio", "F" * 64, id="minio:attack")
    state.apply(plan([keyed(attack)], state))
    result = plan([keyed(event("0055AED6DCD90281F0"))], state)
    assert [record.topic for record in result.outputs] == ["files.events.a"]


def test_a_far_future_supabase_time_does_not_make_the_next_s3_change_stale() -> None:
    state = MemoryState()
    attack = other("supabase", time=datetime(9999, 12, 31, tzinfo=UTC), id="supabase:attack")
    state.apply(plan([keyed(attack)], state))
    real = event(time=datetime(2027, 1, 1, tzinfo=UTC))
    assert outcomes(plan([keyed(real)], state)) == {("a", "emitted"): 1}


def test_a_b2_event_id_equal_to_an_s3_id_does_not_make_the_s3_change_a_duplicate() -> None:
    state = MemoryState()
    real = event()
    attack = other("b2", id=real.id)
    assert outcomes(plan([keyed(attack)], state)) == {("a", "emitted"): 1}
    state.apply(plan([keyed(attack)], state))
    result = plan([keyed(real)], state)
    assert [record.topic for record in result.outputs] == ["files.events.a"]
    assert headers(result.outputs[0])["ce_source"] == b"/storage-events/a/s3"


def test_two_providers_share_no_dedupe_entry_and_no_mark() -> None:
    gcs = other("gcs", "1700000000000001", id="gcs:x", raw={"metageneration": "1"})
    result = plan([keyed(event()), keyed(gcs)])
    writes = event_writes(result)
    assert set(writes) == {(KEYS, 0)}
    assert set(writes[(KEYS, 0)]) == {S3_KEY, mark_key("a", gcs, "gcs")}
    s3_record, gcs_record = written(result, S3_KEY), written(result, mark_key("a", gcs, "gcs"))
    assert id_list(s3_record) == ["s3:0055AED6DCD90281E5"]
    assert id_list(gcs_record) == ["gcs:x"]
    assert s3_record.mark is not None and s3_record.mark.event_id == "s3:0055AED6DCD90281E5"
    assert gcs_record.mark is not None and gcs_record.mark.event_id == "gcs:x"


def azure(
    account: str | None, sequencer: str, event_id: str, cloud_events: bool = False
) -> FileEvent:
    origin = (
        f"/subscriptions/0/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/{account}"
        if account
        else None
    )
    raw: dict[str, Any] = {"source" if cloud_events else "topic": origin}
    return event(provider="azure", sequencer=sequencer, id=event_id, raw=raw)


def test_two_azure_storage_accounts_order_and_dedupe_apart() -> None:
    high = azure("accounta", "0000000000000442000000000002896B", "same-id")
    low = azure("accountb", "00000000000004420000000000028963", "same-id", cloud_events=True)
    result = plan([keyed(high), keyed(low)])
    assert outcomes(result) == {("a", "emitted"): 2}
    again = plan([keyed(low), keyed(azure("accountb", "0000", "other"))], MemoryState())
    assert outcomes(again) == {("a", "emitted"): 1, ("a", "stale"): 1}


def test_s3_outside_the_aws_partition_is_a_scope_of_its_own() -> None:
    china = event("0055AED6DCD90281E5", raw={"awsRegion": "cn-north-1"})
    result = plan([keyed(event("0055AED6DCD9028200")), keyed(china)])
    assert outcomes(result) == {("a", "emitted"): 2}
    assert id_list(written(result, mark_key("a", china, "s3@aws-cn"))) == [china.id]
    assert id_list(written(result, S3_KEY)) == ["s3:0055AED6DCD9028200"]
    # Its ids, spilled, go to a scoped key: the unscoped one of an `s3:` id is S3's own.
    assert spill_key("a", [china.id, NOW], "s3@aws-cn") == seen_key("a", china.id, "s3@aws-cn")
    assert spill_key("a", [china.id, NOW], "s3") == seen_key("a", china.id)


def test_reconcile_takes_the_scope_of_the_instance_s_one_source() -> None:
    settings = Settings.model_validate(
        {"instances": [{"name": "a", "sources": ["supabase", "reconcile"]}, {"name": "b"}]}
    )
    supabase_delete = other(
        "supabase", id="supabase:d", type="deleted", time=datetime(2026, 11, 30, 1, tzinfo=UTC)
    )
    listing = other("reconcile", id="reconcile:c", time=datetime(2026, 11, 30, 0, 30, tzinfo=UTC))
    inputs = [keyed(supabase_delete, name) for name in "ab"] + [keyed(listing, n) for n in "ab"]
    result = plan_batch(inputs, settings, MemoryState(), NOW)
    # In `a` the older listing loses to the provider's newer delete; `b` names no source.
    assert outcomes(result) == {("a", "emitted"): 1, ("a", "stale"): 1, ("b", "emitted"): 2}


@pytest.mark.parametrize("provider", ["b2", "supabase"])
def test_a_reconcile_id_never_takes_a_provider_event_s_dedupe_key(provider: str) -> None:
    """Issue 23 #1: a reconcile delivery is ordered in the scope of the instance's provider,
    but its `id` (any string the delivery gives) must not make that provider's real change a
    duplicate, nor the other way round."""
    settings = Settings.model_validate({"instances": [{"name": "a", "sources": [provider]}]})
    real_id = (
        "4_zb330e285b37b4ed375c60c1a_f1000000e1c2ea2b"
        if provider == "b2"
        else ("supabase:0123456789abcdef0123456789abcdef")
    )
    forged = other("reconcile", id=real_id, time=datetime(2026, 11, 30, 0, 30, tzinfo=UTC))
    real = other(provider, id=real_id, time=datetime(2026, 11, 30, 1, tzinfo=UTC))
    state = MemoryState()
    state.apply(plan_batch([keyed(forged)], settings, state, NOW))
    result = plan_batch([keyed(real)], settings, state, NOW)
    assert outcomes(result) == {("a", "emitted"): 1}
    # A provider event naming a reconcile id does not take the listing's key either.
    listing = other(
        "reconcile", id="reconcile:" + "0" * 32, time=datetime(2026, 11, 30, 2, tzinfo=UTC)
    )
    state = MemoryState()
    state.apply(plan_batch([keyed(other(provider, id=listing.id))], settings, state, NOW))
    assert outcomes(plan_batch([keyed(listing)], settings, state, NOW)) == {("a", "emitted"): 1}


@pytest.mark.parametrize("provider_first", [True, False])
def test_a_reconcile_id_and_a_provider_id_equal_as_strings_under_one_key_stay_apart(
    provider_first: bool,
) -> None:
    """Under one key (reconcile ordered in the provider's scope), the two ids are recorded
    apart, each a duplicate of its own redelivery only, in one batch and across batches."""
    settings = Settings.model_validate(
        {"instances": [{"name": "a", "dedupe_ttl": "1h", "sources": ["b2"]}]}
    )
    same_id = "4_zb330e285b37b4ed375c60c1a_f1000000e1c2ea2b"
    real = other("b2", id=same_id, time=datetime(2026, 11, 30, 1, tzinfo=UTC))
    listing = other("reconcile", id=same_id, time=datetime(2026, 11, 30, 1, tzinfo=UTC))
    batch = [keyed(real), keyed(listing)] if provider_first else [keyed(listing), keyed(real)]
    state = MemoryState()
    result = plan_batch(batch, settings, state, NOW)
    assert result.outcomes[("a", "duplicate")] == 0
    assert set(outcomes(result)) <= {("a", "emitted"), ("a", "stale")}
    assert sum(result.outcomes.values()) == 2
    key = mark_key("a", real, "b2")
    assert set(event_writes(result)[(KEYS, 0)]) == {key}  # one key, one record
    entries = written(result, key).ids
    assert sorted(entries, key=len) == [[same_id, NOW + 3600], [same_id, NOW + 3600, 1]]
    state.apply(result)
    for item in (real, listing):
        assert outcomes(plan_batch([keyed(item)], settings, state, NOW + 1)) == {
            ("a", "duplicate"): 1
        }


# --- clock skew -----------------------------------------------------------------------------------


def test_an_event_dated_beyond_the_skew_bound_is_emitted_but_its_time_is_not_recorded() -> None:
    state = MemoryState()
    now = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    honest = other("box", id="box-1", time=datetime(2027, 1, 1, tzinfo=UTC))
    state.apply(plan([keyed(honest)], state, now))
    future = other("box", id="box-2", time=datetime(9999, 12, 31, tzinfo=UTC))
    result = plan([keyed(future)], state, now)
    assert outcomes(result) == {("a", "emitted"): 1}
    state.apply(result)
    mark = stored(state, mark_key("a", future, "box")).mark
    assert mark is not None
    assert (mark.event_id, mark.time) == ("box-2", now)  # the honest event's time stays
    later = other("box", id="box-3", time=datetime(2027, 1, 1, 0, 1, tzinfo=UTC))
    assert outcomes(plan([keyed(later)], state, now + 60)) == {("a", "emitted"): 1}
    older = other("box", id="box-4", time=datetime(2026, 12, 31, tzinfo=UTC))
    assert outcomes(plan([keyed(older)], state, now + 60)) == {("a", "stale"): 1}


def test_an_event_within_the_skew_bound_is_recorded_as_it_is() -> None:
    now = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    ahead = other("box", id="box-1", time=datetime(2027, 1, 1, 0, 4, tzinfo=UTC))
    result = plan([keyed(ahead)], MemoryState(), now)
    mark = written(result, mark_key("a", ahead, "box")).mark
    assert mark is not None and mark.time == now + 240


def test_a_stored_mark_dated_beyond_the_bound_has_no_time() -> None:
    state = MemoryState()
    now = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    item = other("box", id="box-1", time=datetime(2027, 1, 1, tzinfo=UTC))
    poisoned = Mark(kind=None, token=None, time=now + 3600, event_id="box-0", type="created")
    state.put(KEYS, 0, mark_key("a", item, "box"), encode(KeyState(mark=poisoned)))
    assert outcomes(plan([keyed(item)], state, now)) == {("a", "emitted"): 1}
    # One within the bound orders as it is.
    ahead = Mark(kind=None, token=None, time=now + 60, event_id="box-0", type="created")
    state.put(KEYS, 0, mark_key("a", item, "box"), encode(KeyState(mark=ahead)))
    assert outcomes(plan([keyed(item)], state, now)) == {("a", "stale"): 1}


def test_the_skew_bound_is_a_setting() -> None:
    settings = Settings.model_validate(
        {"stream": {"max_clock_skew_s": "1h"}, "instances": [{"name": "a"}]}
    )
    now = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    ahead = other("box", id="box-1", time=datetime(2027, 1, 1, 0, 30, tzinfo=UTC))
    result = plan_batch([keyed(ahead)], settings, MemoryState(), now)
    mark = written(result, mark_key("a", ahead, "box")).mark
    assert mark is not None and mark.time == now + 1800


# --- the key's record: bounded, spilled, ended ---------------------------------------------------

HOT_SETTINGS = Settings.model_validate(
    {"instances": [{"name": "a", "dedupe_ttl": "1h", "sources": ["b2"]}]}
)
"""TTL 1 h; `reconcile` ordered in `b2`'s scope."""


def hot_s3(index: int) -> FileEvent:
    return event(f"{index:04X}")


def hot_azure(index: int) -> FileEvent:
    return azure("acc", f"{index:032X}", f"azure-{index:02d}")


def hot_listing(index: int) -> FileEvent:
    return other(
        "reconcile", id=f"listing-{index:02d}", time=datetime(2026, 11, 30, 0, index, tzinfo=UTC)
    )


def hot_own_listing(index: int) -> FileEvent:
    return other(
        "reconcile", id=f"reconcile:{index:032x}", time=datetime(2026, 11, 30, 0, index, tzinfo=UTC)
    )


HOT_KEYS: dict[str, tuple[Any, str, Any]] = {
    # (events, the key's scope, the `seen` key a spilled id goes to)
    "s3": (hot_s3, "s3", lambda item: seen_key("a", item.id)),
    "azure": (hot_azure, "azure@acc", lambda item: seen_key("a", item.id, "azure@acc")),
    "reconcile": (hot_listing, "b2", lambda item: seen_key("a", item.id, "reconcile")),
    "reconcile own id": (hot_own_listing, "b2", lambda item: seen_key("a", item.id)),
}


@pytest.mark.parametrize("kind", sorted(HOT_KEYS))
def test_a_hot_key_keeps_a_bounded_record_and_spills_older_ids_with_their_expiry(kind: str) -> None:
    make, scope, seen_at = HOT_KEYS[kind]
    items = [make(index) for index in range(1, RECENT_IDS + 5)]
    key = mark_key("a", items[0], scope)
    state = MemoryState()
    sizes: list[int] = []
    for index, item in enumerate(items):  # one a second, each batch applied
        result = plan_batch([keyed(item)], HOT_SETTINGS, state, NOW + index)
        assert outcomes(result) == {("a", "emitted"): 1}
        state.apply(result)
        assert len(stored(state, key).ids) == min(index + 1, RECENT_IDS)
        sizes.append(len(state.get(KEYS, 0, key) or b""))
    current = stored(state, key)
    assert id_list(current) == [item.id for item in items[-RECENT_IDS:]]
    spilled = items[: len(items) - RECENT_IDS]
    assert len(spilled) == 4
    # Each spilled id under the key its lookup reads, with the expiry it was first given.
    seen = {key: value for (table, _, key), value in state.data.items() if table == SEEN}
    assert seen == {
        seen_at(item): encode_expiry(NOW + index + 3600) for index, item in enumerate(spilled)
    }
    assert set(seen) == {dedupe_key(parsed(item), HOT_SETTINGS.instance("a")) for item in spilled}
    assert current.spill_until == NOW + 3 + 3600
    # The record stops growing once it is full: its millionth change costs what its ninth did.
    assert len(set(sizes[RECENT_IDS:])) == 1
    assert sizes[RECENT_IDS] < 2 * sizes[0] * RECENT_IDS


@pytest.mark.parametrize("kind", sorted(HOT_KEYS))
def test_a_redelivery_of_a_spilled_id_is_still_a_duplicate(kind: str) -> None:
    make, _, seen_at = HOT_KEYS[kind]
    items = [make(index) for index in range(1, RECENT_IDS + 4)]
    state = MemoryState()
    first = plan_batch([keyed(item) for item in items], HOT_SETTINGS, state, NOW)
    assert outcomes(first) == {("a", "emitted"): len(items)}
    # Within the batch the spill is already read back.
    assert set(first.writes[(SEEN, 0)]) == {seen_at(item) for item in items[:3]}
    state.apply(first)
    again = plan_batch([keyed(item) for item in items], HOT_SETTINGS, state, NOW + 10)
    assert outcomes(again) == {("a", "duplicate"): len(items)}
    assert again.writes == {}
    # Once its expiry passed, a spilled id is new again (older than the mark: stale).
    late = plan_batch([keyed(items[0])], HOT_SETTINGS, state, NOW + 3600)
    assert outcomes(late) == {("a", "stale"): 1}


def test_a_redelivery_of_a_spilled_id_within_its_batch_is_a_duplicate() -> None:
    items = [hot_s3(index) for index in range(1, RECENT_IDS + 2)]
    result = plan([keyed(item) for item in items] + [keyed(items[0])])
    assert outcomes(result) == {("a", "emitted"): len(items), ("a", "duplicate"): 1}
    assert result.writes[(SEEN, 0)] == {seen_key("a", items[0].id): encode_expiry(NOW + 60)}


class CountingState(MemoryState):
    """MemoryState that records every read, as (table, key)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, bytes]] = []

    def get(self, table: str, partition: int, key: bytes) -> bytes | None:
        self.reads.append((table, key))
        return super().get(table, partition, key)


def closed_windows(state: CountingState) -> CountingState:
    """A partition upgraded from two tables whose upgrade windows have both closed."""
    upgraded(state)
    for marker in MARKERS:
        state.put(KEYS, 0, marker, encode_expiry(NOW - 1))
    return state


def test_seen_is_read_only_for_a_key_whose_record_says_ids_were_spilled() -> None:
    hot, cool = event("0009"), event("0009", key="cool")
    hot_key, cool_key = S3_KEY, mark_key("a", cool, "s3")
    state = closed_windows(CountingState())
    older = mark_for(event("0001"))
    state.put(KEYS, 0, hot_key, encode(KeyState(older, [["s3:0002", NOW + 30]], None, NOW + 30)))
    state.put(KEYS, 0, cool_key, encode(KeyState(older, [["s3:0002", NOW + 30]])))
    result = plan([keyed(cool), keyed(hot)], state)
    assert outcomes(result) == {("a", "emitted"): 2}
    assert state.reads == [
        (KEYS, cool_key),
        (KEYS, SEEN_UNTIL_KEY),  # the closed window, once per batch
        (KEYS, hot_key),
        (SEEN, seen_key("a", hot.id)),  # the hot key's second read
    ]
    # Once `spill_until` passed, the hot key costs one read again.
    state.reads.clear()
    assert outcomes(plan([keyed(hot)], state, NOW + 30)) == {("a", "emitted"): 1}
    assert state.reads == [(KEYS, hot_key), (KEYS, SEEN_UNTIL_KEY)]


def test_the_record_carries_the_etag_of_the_newest_event_emitted() -> None:
    state = MemoryState()
    state.apply(plan([keyed(event("0002", etag="e-2"))], state))
    assert stored(state, S3_KEY).etag == "e-2"
    stale = event("0001", etag="e-1")
    version_gone = event("0003", type="deleted", version_only=True, version_id="v0", etag="e-v")
    result = plan([keyed(stale), keyed(version_gone)], state)
    assert outcomes(result) == {("a", "stale"): 1, ("a", "emitted"): 1}
    state.apply(result)
    assert stored(state, S3_KEY).etag == "e-2"  # neither changed the current object
    state.apply(plan([keyed(event("0004", etag="e-4"))], state))
    assert stored(state, S3_KEY).etag == "e-4"
    state.apply(plan([keyed(event("0005", type="deleted", etag=None))], state))
    current = stored(state, S3_KEY)
    assert current.etag is None  # deleted: no object, no ETag
    assert current.mark is not None and current.mark.type == "deleted"


@pytest.mark.parametrize(("grace", "end"), [(5.0, NOW + 60), (600.0, NOW + 600)])
def test_a_deleted_key_s_record_ends_at_the_latest_of_its_grace_and_its_ids(
    grace: float, end: float
) -> None:
    settings = Settings.model_validate(
        {"stream": {"deleted_mark_grace_s": grace}, "instances": [{"name": "a", "dedupe_ttl": 60}]}
    )
    result = plan_batch([keyed(event("0003", type="deleted"))], settings, MemoryState(), NOW)
    value = result.writes[(KEYS, 0)][S3_KEY]
    assert record_forget_at(value) == end
    current = decode(value)
    assert current.mark is not None and current.mark.forget_at == NOW + grace
    assert current.ids == [["s3:0003", NOW + 60]]


def test_a_live_key_s_record_has_no_end() -> None:
    result = plan([keyed(event("0003", type="deleted")), keyed(event("0004"))])
    value = result.writes[(KEYS, 0)][S3_KEY]
    assert FORGETTABLE_MARKER not in value
    assert record_forget_at(value) is None
    assert decode(value).forget_at() is None


# --- reads and writes per event ----------------------------------------------------------------

AZURE_ACCOUNT = "/subscriptions/0/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/acc"


def azure_at(sequencer: str, event_id: str, key: str = "photos/red flower.jpg") -> FileEvent:
    return other("azure", sequencer, id=event_id, key=key, raw={"topic": AZURE_ACCOUNT})


def test_once_the_windows_are_closed_an_event_costs_one_read_and_a_key_one_write() -> None:
    """One read per key a batch touches (its record), plus each window marker of the
    partition read once per batch (and only on a miss: the `seen` window's for a new id,
    the pre-scope one's for a key without a mark); one `keys` record written per key."""
    state = closed_windows(CountingState())
    item, second = azure_at("0001", "9f1c"), azure_at("0002", "9f1d", "other")
    third = azure_at("0003", "9f1e")  # item's key again
    key, second_key = mark_key("a", item, "azure@acc"), mark_key("a", second, "azure@acc")
    result = plan([keyed(item), keyed(second), keyed(third)], state)
    assert outcomes(result) == {("a", "emitted"): 3}
    assert state.reads == [
        (KEYS, key),
        (KEYS, SEEN_UNTIL_KEY),
        (KEYS, LEGACY_UNTIL_KEY),
        (KEYS, second_key),
    ]
    assert set(result.writes) == {(KEYS, 0)}
    assert set(result.writes[(KEYS, 0)]) == {key, second_key}  # the markers are not rewritten
    assert id_list(written(result, key)) == ["9f1c", "9f1e"]

    state.apply(result)
    state.reads.clear()
    fourth = azure_at("0004", "9f1f", "other")
    again = plan([keyed(third), keyed(fourth)], state)
    assert outcomes(again) == {("a", "duplicate"): 1, ("a", "emitted"): 1}
    # A duplicate in its record costs its read alone; a key with a mark never reads the
    # pre-scope window.
    assert state.reads == [(KEYS, key), (KEYS, second_key), (KEYS, SEEN_UNTIL_KEY)]
    assert set(again.writes) == {(KEYS, 0)}
    assert set(again.writes[(KEYS, 0)]) == {second_key}


def test_on_a_fresh_partition_an_event_costs_one_read_once_the_markers_are_written() -> None:
    state = CountingState()  # no state at all: no changelog offset in any table
    item, second = azure_at("0001", "9f1c"), azure_at("0002", "9f1d", "other")
    key, second_key = mark_key("a", item, "azure@acc"), mark_key("a", second, "azure@acc")
    first = plan([keyed(item), keyed(second)], state)
    assert outcomes(first) == {("a", "emitted"): 2}
    # The first batch sets both markers: each read, and the tables' offsets asked once.
    assert state.reads == [
        (KEYS, key),
        (KEYS, SEEN_UNTIL_KEY),
        (SEEN, OFFSET_KEY),
        (MARKS, OFFSET_KEY),
        (KEYS, LEGACY_UNTIL_KEY),
        (SEEN, OFFSET_KEY),
        (MARKS, OFFSET_KEY),
        (KEYS, OFFSET_KEY),
        (KEYS, second_key),
    ]
    assert set(first.writes) == {(KEYS, 0)}
    assert set(first.writes[(KEYS, 0)]) == {key, second_key, *MARKERS}
    state.apply(first)
    state.reads.clear()
    third = azure_at("0003", "9f1e", "third")
    later = plan([keyed(third)], state)
    assert state.reads == [
        (KEYS, mark_key("a", third, "azure@acc")),
        (KEYS, SEEN_UNTIL_KEY),
        (KEYS, LEGACY_UNTIL_KEY),
    ]
    assert set(later.writes) == {(KEYS, 0)}
    assert set(later.writes[(KEYS, 0)]) == {mark_key("a", third, "azure@acc")}


def test_a_key_changed_many_times_in_a_batch_writes_one_record() -> None:
    items = [event("0003"), event("0001"), event("0003"), event("0004"), event("0005")]
    result = plan([keyed(item) for item in items])
    assert outcomes(result) == {("a", "emitted"): 3, ("a", "stale"): 1, ("a", "duplicate"): 1}
    assert set(event_writes(result)) == {(KEYS, 0)}
    assert set(event_writes(result)[(KEYS, 0)]) == {S3_KEY}
    current = written(result, S3_KEY)
    assert id_list(current) == ["s3:0003", "s3:0001", "s3:0004", "s3:0005"]
    assert current.mark is not None and current.mark.event_id == "s3:0005"


# --- upgrade from two tables (`seen` and `marks`, before per-key state) ------------------------


def test_after_the_per_key_upgrade_old_ids_and_marks_still_count() -> None:
    """The restore moved each `marks` entry into its key's record (`migrated_mark`); ids stay
    in `seen`, read in the window this partition's first plan opens."""
    state = upgraded(MemoryState())
    state.put(MARKS, 0, OFFSET_KEY, b"7")
    old_azure = azure_at("0000000000000442000000000002896B", "9f1c")
    old_s3 = event("0055AED6DCD9028200")
    state.put(SEEN, 0, seen_key("a", old_azure.id, "azure@acc"), encode_expiry(NOW + 30))
    state.put(SEEN, 0, seen_key("a", old_s3.id), encode_expiry(NOW + 30))
    for key, value in (
        (S3_KEY, json.dumps(mark_for(old_s3).to_json()).encode()),
        (LEGACY_UNTIL_KEY, encode_expiry(NOW - 1)),  # copied as it is
    ):
        record = migrated_mark(key, value)
        assert record is not None
        state.put(KEYS, 0, key, record)
    older = event("0055AED6DCD90281E5")
    result = plan([keyed(old_azure), keyed(old_s3), keyed(older)], state)
    assert outcomes(result) == {("a", "duplicate"): 2, ("a", "stale"): 1}
    assert b"s3:0055AED6DCD9028200" in headers(result.outputs[0])["stale.reason"]
    assert result.writes[(KEYS, 0)][SEEN_UNTIL_KEY] == encode_expiry(NOW + 3600)
    assert LEGACY_UNTIL_KEY not in result.writes[(KEYS, 0)]


def test_the_seen_window_is_recorded_once_and_closes_after_the_longest_ttl() -> None:
    item = azure_at("0001", "9f1c")
    state = upgraded(MemoryState())
    state.put(KEYS, 0, LEGACY_UNTIL_KEY, encode_expiry(NOW - 1))
    # An expiry past the window, to show that the window, not the entry, ends the read.
    state.put(SEEN, 0, seen_key("a", item.id, "azure@acc"), encode_expiry(NOW + 7200))
    first = plan([keyed(item)], state)
    assert outcomes(first) == {("a", "duplicate"): 1}
    assert first.writes == {(KEYS, 0): {SEEN_UNTIL_KEY: encode_expiry(NOW + 3600)}}
    state.apply(first)
    still = plan([keyed(item)], state, NOW + 3599)
    assert (outcomes(still), still.writes) == ({("a", "duplicate"): 1}, {})
    later = plan([keyed(item)], state, NOW + 3600)
    assert outcomes(later) == {("a", "emitted"): 1}
    assert set(later.writes[(KEYS, 0)]) == {mark_key("a", item, "azure@acc")}


@pytest.mark.parametrize("had_state", [True, False])
def test_a_partition_without_earlier_state_never_reads_seen_on_the_common_path(
    had_state: bool,
) -> None:
    item = azure_at("0001", "9f1c")
    state = CountingState()
    if had_state:
        upgraded(state)
    state.put(SEEN, 0, seen_key("a", item.id, "azure@acc"), encode_expiry(NOW + 30))
    state.put(SEEN, 0, seen_key("a", item.id), encode_expiry(NOW + 30))  # pre-scope form
    result = plan([keyed(item)], state)
    if had_state:  # the window is open: the old id counts
        assert outcomes(result) == {("a", "duplicate"): 1}
        assert result.writes[(KEYS, 0)][SEEN_UNTIL_KEY] == encode_expiry(NOW + 3600)
        return
    assert outcomes(result) == {("a", "emitted"): 1}
    assert result.writes[(KEYS, 0)][SEEN_UNTIL_KEY] == encode_expiry(NOW)
    # `seen` asked only for its changelog offset, by each window's first test.
    assert [key for table, key in state.reads if table == SEEN] == [OFFSET_KEY, OFFSET_KEY]
    state.apply(result)
    state.reads.clear()
    new = azure_at("0002", "9f1d")
    assert outcomes(plan([keyed(new)], state)) == {("a", "emitted"): 1}
    assert [table for table, _ in state.reads] == [KEYS, KEYS]  # the record, the marker


# --- upgrade from state written before scopes --------------------------------------------------


def old_key(item: FileEvent) -> bytes:
    return f"a/{item.bucket}/{item.key}".encode()


def legacy_state(*emitted: FileEvent, partition: int = 0, expiry: float = NOW + 30) -> MemoryState:
    """State as the stream left it before scopes, restored since per-key state: ids
    `instance/id` in `seen`; marks `instance/bucket/key` moved into `keys` records of those
    keys (`migrated_mark`); the changelog offset key every applied batch writes."""
    state = MemoryState()
    for table in (SEEN, MARKS, KEYS):
        state.put(table, partition, OFFSET_KEY, b"41")
    for item in emitted:
        state.put(SEEN, partition, f"a/{item.id}".encode(), encode_expiry(expiry))
        record = migrated_mark(old_key(item), json.dumps(mark_for(item).to_json()).encode())
        assert record is not None
        state.put(KEYS, partition, old_key(item), record)
    return state


def test_after_the_upgrade_a_redelivery_of_an_old_event_is_still_a_duplicate() -> None:
    old_s3 = event("0055AED6DCD90281E5")
    old_azure = azure_at("0000000000000442000000000002896B", "9f1c", "b")
    state = legacy_state(old_s3, old_azure)
    result = plan([keyed(old_s3), keyed(old_azure)], state)
    assert outcomes(result) == {("a", "duplicate"): 2}


def test_after_the_upgrade_an_older_event_of_an_old_key_is_still_stale() -> None:
    state = legacy_state(event("0055AED6DCD9028200"))
    result = plan([keyed(event("0055AED6DCD90281E5"))], state)
    assert outcomes(result) == {("a", "stale"): 1}
    assert b"s3:0055AED6DCD9028200" in headers(result.outputs[0])["stale.reason"]
    newer = plan([keyed(event("0055AED6DCD9028300"))], state)
    assert outcomes(newer) == {("a", "emitted"): 1}


def test_the_upgrade_window_is_recorded_once_and_closes_after_the_longest_ttl() -> None:
    old = event("0055AED6DCD9028200")
    state = legacy_state(old, expiry=NOW + 7200)
    first = plan([keyed(event("0055AED6DCD90281E5", key="other"))], state)
    assert first.writes[(KEYS, 0)][LEGACY_UNTIL_KEY] == encode_expiry(NOW + 3600)
    state.apply(first)
    assert outcomes(plan([keyed(event("0055AED6DCD90281E0"))], state, NOW + 3599)) == {
        ("a", "stale"): 1
    }
    later = plan([keyed(event("0055AED6DCD90281E1"))], state, NOW + 3600)
    assert outcomes(later) == {("a", "emitted"): 1}
    assert LEGACY_UNTIL_KEY not in later.writes.get((KEYS, 0), {})


def test_a_pre_scope_window_copied_from_marks_is_the_one_read() -> None:
    state = legacy_state(event("0055AED6DCD9028200"))
    marker = migrated_mark(LEGACY_UNTIL_KEY, encode_expiry(NOW + 100))
    assert marker == encode_expiry(NOW + 100)
    assert marker is not None
    state.put(KEYS, 0, LEGACY_UNTIL_KEY, marker)
    older = event("0055AED6DCD90281E5")
    within = plan([keyed(older)], state, NOW + 99)
    assert outcomes(within) == {("a", "stale"): 1}
    assert LEGACY_UNTIL_KEY not in within.writes[(KEYS, 0)]
    assert outcomes(plan([keyed(older)], state, NOW + 100)) == {("a", "emitted"): 1}


def test_a_partition_without_state_never_reads_old_keys() -> None:
    state = CountingState()  # no changelog offset: nothing was ever written here
    old = event("0055AED6DCD9028200")
    record = migrated_mark(old_key(old), json.dumps(mark_for(old).to_json()).encode())
    assert record is not None
    state.put(KEYS, 0, old_key(old), record)
    state.put(SEEN, 0, f"a/{old.id}".encode(), encode_expiry(NOW + 30))
    result = plan([keyed(event("0055AED6DCD90281E5")), keyed(old)], state)
    assert outcomes(result) == {("a", "emitted"): 2}  # older than the old mark; its old id
    assert result.writes[(KEYS, 0)][LEGACY_UNTIL_KEY] == encode_expiry(NOW)
    assert (KEYS, old_key(old)) not in state.reads
    assert (SEEN, f"a/{old.id}".encode()) not in state.reads


def test_old_state_cannot_be_used_to_poison_through_the_fallback() -> None:
    """A B2 delivery after the upgrade with an S3-shaped id writes a scoped key only; an S3
    change never reads an old key of another provider's id, and an old mark counts only for
    the provider it came from."""
    real = event("0055AED6DCD9028300")
    minio_poison = other("minio", "F" * 64, id="minio:poison")
    eventbridge_poison = other("eventbridge", "F" * 64, id="2b1e-uuid")
    state = legacy_state(minio_poison)
    b2_attack = other("b2", id=real.id)
    attack = plan([keyed(b2_attack)], state)
    assert event_writes(attack) == {
        (KEYS, 0): {
            mark_key("a", b2_attack, "b2"): attack.writes[(KEYS, 0)][mark_key("a", b2_attack, "b2")]
        }
    }
    state.apply(attack)
    assert outcomes(plan([keyed(real)], state)) == {("a", "emitted"): 1}
    # An old unprefixed mark with an AWS sequencer is EventBridge's: not S3's.
    state = legacy_state(eventbridge_poison)
    assert outcomes(plan([keyed(real)], state)) == {("a", "emitted"): 1}
    late_eventbridge = other("eventbridge", "0055AED6DCD9028300", id="7c2d-uuid")
    assert outcomes(plan([keyed(late_eventbridge)], state)) == {("a", "stale"): 1}


def test_an_old_dedupe_entry_of_another_source_s_id_is_not_read() -> None:
    """`b2` ids `s3:...` fall back to nothing: the old key of an `s3:` id is S3's, which S3
    keeps writing after the upgrade."""
    real = event()
    state = legacy_state(real)
    assert outcomes(plan([keyed(other("b2", id=real.id))], state)) == {("a", "emitted"): 1}
    native = other("b2", id="4_z27c88f1d182b150646ff0b16_f200ec6a")
    state = legacy_state(native)
    assert outcomes(plan([keyed(native)], state)) == {("a", "duplicate"): 1}


# --- un-recording a refused event -----------------------------------------------------------------


def test_unrecord_takes_the_id_out_of_its_key_s_record_and_keeps_the_mark() -> None:
    """The emit stage un-records an event whose output Kafka refused (it is dead-lettered):
    its replay after the fix must be no duplicate. The key's mark stays."""
    instance = SETTINGS.instance("a")
    azure_event = azure("accounta", "0000000000000442000000000002896B", "azure-id")
    for item, key in (
        (event("0055AED6DCD9028200"), S3_KEY),
        (azure_event, mark_key("a", azure_event, "azure@accounta")),
    ):
        result = plan([keyed(item)])
        before = written(result, key)
        assert id_list(before) == [item.id]
        unrecord(result, parsed(item), instance, 0)
        after = written(result, key)
        assert after.ids == []
        assert after.mark is not None and after.mark.event_id == item.id
        assert (after.mark, after.etag) == (before.mark, before.etag)
        refused = MemoryState()
        refused.apply(result)
        assert outcomes(plan([keyed(item)], refused, NOW + 1)) == {("a", "emitted"): 1}
        kept = MemoryState()  # without unrecord the replay is a duplicate
        kept.apply(plan([keyed(item)]))
        assert outcomes(plan([keyed(item)], kept, NOW + 1)) == {("a", "duplicate"): 1}


def test_unrecord_takes_out_that_event_s_id_only() -> None:
    instance = HOT_SETTINGS.instance("a")
    same_id = "4_zb330e285b37b4ed375c60c1a_f1000000e1c2ea2b"
    real = other("b2", id=same_id, time=datetime(2026, 11, 30, 1, tzinfo=UTC))
    listing = other("reconcile", id=same_id, time=datetime(2026, 11, 30, 1, 30, tzinfo=UTC))
    later = other("b2", id="4_later", time=datetime(2026, 11, 30, 2, tzinfo=UTC))
    result = plan_batch(
        [keyed(item) for item in (real, listing, later)], HOT_SETTINGS, MemoryState(), NOW
    )
    assert outcomes(result) == {("a", "emitted"): 3}
    key = mark_key("a", real, "b2")
    unrecord(result, parsed(listing), instance, 0)
    assert written(result, key).ids == [[same_id, NOW + 3600], ["4_later", NOW + 3600]]
    unrecord(result, parsed(real), instance, 0)
    current = written(result, key)
    assert current.ids == [["4_later", NOW + 3600]]
    assert current.mark is not None and current.mark.event_id == "4_later"


def test_unrecord_takes_back_an_id_spilled_within_the_batch() -> None:
    instance = SETTINGS.instance("a")
    items = [hot_s3(index) for index in range(1, RECENT_IDS + 2)]
    result = plan([keyed(item) for item in items])
    refused = parsed(items[0])
    assert result.writes[(SEEN, 0)] == {dedupe_key(refused, instance): encode_expiry(NOW + 60)}
    unrecord(result, refused, instance, 0)
    assert result.writes[(SEEN, 0)] == {}
    assert id_list(written(result, S3_KEY)) == [item.id for item in items[1:]]
    state = MemoryState()
    state.apply(result)
    # No duplicate (older than the key's mark, so stale); its neighbours still are.
    assert outcomes(plan([keyed(items[0])], state, NOW + 1)) == {("a", "stale"): 1}
    assert outcomes(plan([keyed(items[1])], state, NOW + 1)) == {("a", "duplicate"): 1}


def test_dedupe_key_is_the_key_a_spilled_id_is_written_to() -> None:
    azure_event = azure("accounta", "0000000000000442000000000002896B", "azure-id")
    instance = SETTINGS.instance("a")
    assert dedupe_key(parsed(event()), instance) == seen_key("a", event().id)
    assert dedupe_key(parsed(azure_event), instance) == seen_key("a", "azure-id", "azure@accounta")
    assert dedupe_key(parsed(azure_event), instance) != seen_key("a", "azure-id")
    assert spill_key("a", ["azure-id", NOW], "azure@accounta") == dedupe_key(
        parsed(azure_event), instance
    )
