"""streams.core.emitting.plan_batch: dedupe, per-key order and output records, against in-memory
state.

`MemoryState` is a plain implementation of the StateReader protocol (the state interface, not
Kafka); applying a plan's `writes` to it is what the worker does once Kafka acknowledged the
batch's outputs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from streams.config import Settings
from streams.core.emitting import (
    LEGACY_UNTIL_KEY,
    MARKS,
    SEEN,
    EmitPlan,
    KeyedInput,
    PendingState,
    dedupe_key,
    mark_key,
    plan_batch,
    seen_key,
)
from streams.core.event import FileEvent
from streams.core.ordering import Mark, mark_for
from streams.core.records import OutRecord, keyed_record, parse_keyed
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


def event_writes(result: EmitPlan) -> dict[tuple[str, int], dict[bytes, bytes]]:
    """The plan's writes without the partition's legacy-window entry (written once)."""
    found = {
        place: {key: value for key, value in items.items() if key != LEGACY_UNTIL_KEY}
        for place, items in result.writes.items()
    }
    return {place: items for place, items in found.items() if items}


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
    assert set(result.writes) == {(SEEN, 3), (MARKS, 3)}
    assert set(result.writes[(MARKS, 3)]) == {mark_key("a", item, "s3"), LEGACY_UNTIL_KEY}
    assert result.writes[(SEEN, 3)] == {seen_key("a", item.id): f"{NOW + 60:.3f}".encode()}
    mark = Mark.from_json(json.loads(result.writes[(MARKS, 3)][mark_key("a", item, "s3")]))
    assert (mark.kind, mark.event_id, mark.type) == ("aws-sequencer", item.id, "created")


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


@pytest.mark.parametrize(
    ("stored_expiry", "duplicate"),
    [(NOW + 0.001, True), (NOW + 59, True), (NOW, False), (NOW - 1, False)],
)
def test_expiry_is_honoured(stored_expiry: float, duplicate: bool) -> None:
    item = event()
    state = MemoryState()
    state.put(SEEN, 0, seen_key("a", item.id), f"{stored_expiry:.3f}".encode())
    result = plan([keyed(item)], state)
    if duplicate:
        assert (result.outputs, outcomes(result)) == ([], {("a", "duplicate"): 1})
    else:
        assert outcomes(result) == {("a", "emitted"): 1}
        assert result.writes[(SEEN, 0)][seen_key("a", item.id)] == f"{NOW + 60:.3f}".encode()


def test_the_lease_is_the_instance_ttl() -> None:
    item = event()
    result = plan([keyed(item, "b")])
    assert result.writes[(SEEN, 0)][seen_key("b", item.id)] == f"{NOW + 3600:.3f}".encode()


def test_a_duplicate_does_not_extend_the_lease() -> None:
    state = MemoryState()
    item = event()
    state.apply(plan([keyed(item)], state, NOW))
    state.apply(plan([keyed(item)], state, NOW + 30))  # duplicate: nothing written
    assert state.get(SEEN, 0, seen_key("a", item.id)) == f"{NOW + 60:.3f}".encode()
    again = plan([keyed(item)], state, NOW + 60)  # the original lease has run out
    assert outcomes(again) == {("a", "emitted"): 1}
    assert again.writes[(SEEN, 0)][seen_key("a", item.id)] == f"{NOW + 120:.3f}".encode()


def test_an_unreadable_expiry_is_no_expiry() -> None:
    item = event()
    state = MemoryState()
    state.put(SEEN, 0, seen_key("a", item.id), b"not a number")
    assert outcomes(plan([keyed(item)], state)) == {("a", "emitted"): 1}


def test_state_is_read_from_the_record_partition() -> None:
    item = event()
    state = MemoryState()
    state.put(SEEN, 1, seen_key("a", item.id), f"{NOW + 10:.3f}".encode())
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
    # The stale event's id is recorded (its redelivery is a duplicate); the mark is not moved.
    assert set(event_writes(result)) == {(SEEN, 0)}


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
    mark = Mark.from_json(json.loads(result.writes[(MARKS, 0)][mark_key("a", event(), "s3")]))
    assert mark.event_id == "s3:0003"


def test_keys_are_ordered_independently() -> None:
    result = plan([keyed(event("0003", key="x")), keyed(event("0001", key="y"))])
    assert outcomes(result) == {("a", "emitted"): 2}


def test_instances_are_ordered_independently() -> None:
    result = plan([keyed(event("0003"), "a"), keyed(event("0001"), "b")])
    assert outcomes(result) == {("a", "emitted"): 1, ("b", "emitted"): 1}


def test_a_newer_event_moves_the_mark() -> None:
    result = plan([keyed(event("0001")), keyed(event("0002")), keyed(event("0003"))])
    assert outcomes(result) == {("a", "emitted"): 3}
    mark = Mark.from_json(json.loads(result.writes[(MARKS, 0)][mark_key("a", event(), "s3")]))
    assert mark.event_id == "s3:0003"


def test_a_version_only_delete_is_emitted_but_does_not_move_the_mark() -> None:
    created = event("0001")
    version_gone = event("0003", type="deleted", version_id="v0", version_only=True)
    later_created = event("0002")
    result = plan([keyed(created), keyed(version_gone), keyed(later_created)])
    assert [record.topic for record in result.outputs] == ["files.events.a"] * 3
    assert headers(result.outputs[1])["ce_type"] == b"storage.object.deleted"
    mark = Mark.from_json(json.loads(result.writes[(MARKS, 0)][mark_key("a", created, "s3")]))
    assert mark.event_id == later_created.id


def test_a_version_only_delete_alone_writes_no_mark() -> None:
    item = event("0003", type="deleted", version_only=True)
    result = plan([keyed(item)])
    assert outcomes(result) == {("a", "emitted"): 1}
    assert set(event_writes(result)) == {(SEEN, 0)}


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
    seen_keys = set(result.writes[(SEEN, 0)])
    assert seen_keys == {seen_key("a", "s3:0055AED6DCD90281E5"), seen_key("a", "gcs:x")}
    marks = set(event_writes(result)[(MARKS, 0)])
    assert marks == {mark_key("a", event(), "s3"), mark_key("a", gcs, "gcs")}


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
    assert seen_key("a", china.id, "s3@aws-cn") in result.writes[(SEEN, 0)]


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
    mark = Mark.from_json(json.loads(state.get(MARKS, 0, mark_key("a", future, "box")) or b""))
    assert (mark.event_id, mark.time) == ("box-2", now)  # the honest event's time stays
    later = other("box", id="box-3", time=datetime(2027, 1, 1, 0, 1, tzinfo=UTC))
    assert outcomes(plan([keyed(later)], state, now + 60)) == {("a", "emitted"): 1}
    older = other("box", id="box-4", time=datetime(2026, 12, 31, tzinfo=UTC))
    assert outcomes(plan([keyed(older)], state, now + 60)) == {("a", "stale"): 1}


def test_an_event_within_the_skew_bound_is_recorded_as_it_is() -> None:
    now = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    ahead = other("box", id="box-1", time=datetime(2027, 1, 1, 0, 4, tzinfo=UTC))
    result = plan([keyed(ahead)], MemoryState(), now)
    mark = Mark.from_json(json.loads(result.writes[(MARKS, 0)][mark_key("a", ahead, "box")]))
    assert mark.time == now + 240


def test_a_stored_mark_dated_beyond_the_bound_has_no_time() -> None:
    state = MemoryState()
    now = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    item = other("box", id="box-1", time=datetime(2027, 1, 1, tzinfo=UTC))
    poisoned = Mark(kind=None, token=None, time=now + 3600, event_id="box-0", type="created")
    state.put(MARKS, 0, mark_key("a", item, "box"), json.dumps(poisoned.to_json()).encode())
    assert outcomes(plan([keyed(item)], state, now)) == {("a", "emitted"): 1}


def test_the_skew_bound_is_a_setting() -> None:
    settings = Settings.model_validate(
        {"stream": {"max_clock_skew_s": "1h"}, "instances": [{"name": "a"}]}
    )
    now = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    ahead = other("box", id="box-1", time=datetime(2027, 1, 1, 0, 30, tzinfo=UTC))
    result = plan_batch([keyed(ahead)], settings, MemoryState(), now)
    mark = Mark.from_json(json.loads(result.writes[(MARKS, 0)][mark_key("a", ahead, "box")]))
    assert mark.time == now + 1800


# --- upgrade from state written before scopes --------------------------------------------------


def legacy_state(*emitted: FileEvent, partition: int = 0, expiry: float = NOW + 30) -> MemoryState:
    """State as the stream left it before scopes: `instance/id` and `instance/bucket/key`,
    with the changelog offset key every applied batch writes."""
    state = MemoryState()
    for table in (SEEN, MARKS):
        state.put(table, partition, OFFSET_KEY, b"41")
    for item in emitted:
        state.put(SEEN, partition, f"a/{item.id}".encode(), f"{expiry:.3f}".encode())
        mark = json.dumps(mark_for(item).to_json()).encode()
        state.put(MARKS, partition, f"a/{item.bucket}/{item.key}".encode(), mark)
    return state


AZURE_ACCOUNT = "/subscriptions/0/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/acc"


def test_after_the_upgrade_a_redelivery_of_an_old_event_is_still_a_duplicate() -> None:
    old_s3 = event("0055AED6DCD90281E5")
    old_azure = other(
        "azure",
        "0000000000000442000000000002896B",
        id="9f1c",
        key="b",
        raw={"topic": AZURE_ACCOUNT},
    )
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
    assert first.writes[(MARKS, 0)][LEGACY_UNTIL_KEY] == f"{NOW + 3600:.3f}".encode()
    state.apply(first)
    assert outcomes(plan([keyed(event("0055AED6DCD90281E0"))], state, NOW + 3599)) == {
        ("a", "stale"): 1
    }
    later = plan([keyed(event("0055AED6DCD90281E1"))], state, NOW + 3600)
    assert outcomes(later) == {("a", "emitted"): 1}
    assert LEGACY_UNTIL_KEY not in later.writes.get((MARKS, 0), {})


def test_a_partition_without_state_never_reads_old_keys() -> None:
    state = MemoryState()  # no changelog offset: nothing was ever written here
    state.put(MARKS, 0, b"a/uploads/photos/red flower.jpg", b'{"kind": "aws-sequencer"}')
    result = plan([keyed(event())], state)
    assert result.writes[(MARKS, 0)][LEGACY_UNTIL_KEY] == f"{NOW:.3f}".encode()


class CountingState(MemoryState):
    def __init__(self, base: MemoryState) -> None:
        super().__init__()
        self.data = dict(base.data)
        self.reads: list[bytes] = []

    def get(self, table: str, partition: int, key: bytes) -> bytes | None:
        self.reads.append(key)
        return super().get(table, partition, key)


def test_once_the_window_is_closed_an_event_costs_one_read_per_table_as_before() -> None:
    state = CountingState(MemoryState())
    state.put(MARKS, 0, LEGACY_UNTIL_KEY, f"{NOW - 1:.3f}".encode())
    item = other("azure", "0001", id="9f1c", raw={"topic": AZURE_ACCOUNT})
    second = other("azure", "0002", id="9f1d", key="other", raw={"topic": AZURE_ACCOUNT})
    plan([keyed(item), keyed(second)], state)
    assert state.reads == [  # the window's entry once per batch and partition
        seen_key("a", "9f1c", "azure@acc"),
        LEGACY_UNTIL_KEY,
        mark_key("a", item, "azure@acc"),
        seen_key("a", "9f1d", "azure@acc"),
        mark_key("a", second, "azure@acc"),
    ]


def test_old_state_cannot_be_used_to_poison_through_the_fallback() -> None:
    """A B2 delivery after the upgrade with an S3-shaped id writes a scoped key only; an S3
    change never reads an old key of another provider's id, and an old mark counts only for
    the provider it came from."""
    real = event("0055AED6DCD9028300")
    minio_poison = other("minio", "F" * 64, id="minio:poison")
    eventbridge_poison = other("eventbridge", "F" * 64, id="2b1e-uuid")
    state = legacy_state(minio_poison)
    attack = plan([keyed(other("b2", id=real.id))], state)
    assert seen_key("a", real.id) not in attack.writes[(SEEN, 0)]
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


def test_dedupe_key_is_the_key_the_plan_records() -> None:
    """The emit stage un-records a refused event's id by `dedupe_key`: it must name exactly
    the key the plan wrote, for own derived ids (the key before scopes) and for scoped ones."""
    azure_event = azure("accounta", "0000000000000442000000000002896B", "azure-id")
    instance = SETTINGS.instance("a")
    for item in (event("0055AED6DCD9028200"), azure_event):
        result = plan([keyed(item)])
        parsed = parse_keyed(keyed(item).value, keyed(item).headers)
        recorded = set(event_writes(result)[(SEEN, 0)])
        assert recorded == {dedupe_key(parsed, instance)}
    assert dedupe_key(
        parse_keyed(keyed(azure_event).value, keyed(azure_event).headers), instance
    ) != seen_key("a", "azure-id")
