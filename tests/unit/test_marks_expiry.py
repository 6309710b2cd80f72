"""Deleted keys' ordering marks are forgotten after a grace; live keys' marks are kept.

The decisions are pure (streams.core.ordering `with_grace`/`forgotten`, streams.core.emitting
`plan_batch`, `key_revision` for the `keys` records that hold the marks since per-key state,
`migrated_mark` that moves a `marks` entry into one, and `mark_forget_at`, the restore's reader
of the legacy `marks` table), tested against in-memory state; the store's `revisions` scan runs
on a real RocksDB database in a temporary directory.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from streams.config import ConfigError, Settings, load_settings
from streams.core.emitting import (
    KEYS,
    LEGACY_UNTIL_KEY,
    MARKS,
    SEEN_UNTIL_KEY,
    EmitPlan,
    KeyedInput,
    deleted_mark_grace,
    key_revision,
    mark_forget_at,
    mark_instance,
    mark_key,
    migrated_mark,
    plan_batch,
)
from streams.core.event import FileEvent
from streams.core.keystate import FORGETTABLE_MARKER, KeyState, decode, encode, record_forget_at
from streams.core.ordering import Mark, forgotten, mark_for, with_grace
from streams.core.records import keyed_record
from streams.engine.store import Revision, StateStore

NOW = 1_800_000_000.0
TTL_A = 60.0
GRACE = 5.0
DEFAULT_GRACE = Settings.model_validate(
    {"instances": [{"name": "a", "dedupe_ttl": "60s"}, {"name": "b", "dedupe_ttl": "1h"}]}
)
SHORT_GRACE = Settings.model_validate(
    {
        "stream": {"deleted_mark_grace_s": GRACE},
        "instances": [{"name": "a", "dedupe_ttl": "60s"}],
    }
)
REPARTITION = DEFAULT_GRACE.stream.repartition_topic


class MemoryState:
    """(table, partition, key) -> value: the StateReader protocol, no Kafka."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, int, bytes], bytes] = {}

    def get(self, table: str, partition: int, key: bytes) -> bytes | None:
        return self.data.get((table, partition, key))

    def apply(self, plan: EmitPlan) -> None:
        for (table, partition), values in plan.writes.items():
            for key, value in values.items():
                self.data[(table, partition, key)] = value


def event(sequencer: str, type: str = "created", **fields: Any) -> FileEvent:
    values: dict[str, Any] = {
        "id": f"s3:{sequencer}:{type}",
        "type": type,
        "key": "photos/red flower.jpg",
        "bucket": "uploads",
        "time": datetime(2026, 11, 30, 0, 8, 7, tzinfo=UTC),
        "sequencer": sequencer,
        "provider": "s3",
        "raw": {"eventName": "ObjectCreated:Put"},
    }
    return FileEvent(**(values | fields))


def keyed(item: FileEvent, instance: str = "a") -> KeyedInput:
    record = keyed_record(REPARTITION, instance, item, None)
    assert record.value is not None
    return KeyedInput(REPARTITION, 0, record.key, record.value, dict(record.headers))


def stored_mark(state: MemoryState, item: FileEvent, instance: str = "a") -> Mark:
    """The mark in the key's `keys` record."""
    value = state.get(KEYS, 0, mark_key(instance, item, "s3"))
    assert value is not None
    mark = decode(value).mark
    assert mark is not None
    return mark


def run(
    items: list[FileEvent], state: MemoryState, now: float, settings: Settings = SHORT_GRACE
) -> list[str]:
    """Plan one batch, apply it, and say where each event went (topic suffix)."""
    result = plan_batch([keyed(item) for item in items], settings, state, now)
    state.apply(result)
    return [record.topic.rsplit(".", 2)[1] for record in result.outputs]


# --- pure ordering -------------------------------------------------------------------------


def test_only_a_deleted_mark_gets_a_time_to_be_forgotten() -> None:
    deleted = with_grace(mark_for(event("0002", "deleted")), NOW, GRACE)
    created = with_grace(mark_for(event("0003")), NOW, GRACE)
    assert deleted.forget_at == NOW + GRACE
    assert created.forget_at is None
    assert not forgotten(deleted, NOW + GRACE - 0.001)
    assert forgotten(deleted, NOW + GRACE)
    assert not forgotten(created, NOW + 10**9)


def test_a_mark_round_trips_with_its_forget_time_and_a_live_one_stores_none() -> None:
    deleted = with_grace(mark_for(event("0002", "deleted")), NOW, GRACE)
    assert Mark.from_json(json.loads(json.dumps(deleted.to_json()))) == deleted
    assert "forget_at" not in with_grace(mark_for(event("0003")), NOW, GRACE).to_json()


# --- plan_batch ----------------------------------------------------------------------------


def test_a_late_create_older_than_the_delete_is_stale_within_the_grace() -> None:
    state = MemoryState()
    assert run([event("0003"), event("0005", "deleted")], state, NOW) == ["events", "events"]
    assert stored_mark(state, event("0005")).forget_at == NOW + GRACE
    assert run([event("0004")], state, NOW + GRACE - 0.5) == ["stale"]


def test_a_late_create_older_than_the_delete_is_emitted_after_the_grace() -> None:
    state = MemoryState()
    run([event("0003"), event("0005", "deleted")], state, NOW)
    # Not swept yet: the plan itself reads a mark past its grace as none.
    assert run([event("0004")], state, NOW + GRACE) == ["events"]
    mark = stored_mark(state, event("0004"))
    assert (mark.type, mark.forget_at) == ("created", None)


def test_a_live_keys_mark_is_never_forgotten() -> None:
    state = MemoryState()
    run([event("0005")], state, NOW)
    assert run([event("0004")], state, NOW + 365 * 86400.0) == ["stale"]


def test_a_create_after_the_delete_makes_the_mark_live_again() -> None:
    state = MemoryState()
    run([event("0005", "deleted"), event("0006")], state, NOW)
    assert stored_mark(state, event("0006")).forget_at is None
    assert run([event("0004")], state, NOW + 10 * GRACE) == ["stale"]


def test_the_default_grace_is_the_instances_dedupe_ttl() -> None:
    state = MemoryState()
    run([event("0005", "deleted")], state, NOW, DEFAULT_GRACE)
    assert stored_mark(state, event("0005")).forget_at == NOW + TTL_A
    assert deleted_mark_grace(DEFAULT_GRACE, "b") == 3600.0
    assert deleted_mark_grace(DEFAULT_GRACE, "gone") == 3600.0  # the longest
    assert deleted_mark_grace(SHORT_GRACE, "a") == GRACE


def test_a_version_only_delete_leaves_the_live_mark_as_it_was() -> None:
    state = MemoryState()
    run([event("0003"), event("0005", "deleted", version_only=True)], state, NOW)
    assert stored_mark(state, event("0003")).forget_at is None
    assert run([event("0002")], state, NOW + 10 * GRACE) == ["stale"]


# --- the sweep's decision and the restore's reader ----------------------------------------


def mark_bytes(mark: Mark) -> bytes:
    return json.dumps(mark.to_json()).encode()


def record(mark: Mark | None = None, ids: list[list[Any]] | None = None, **more: Any) -> bytes:
    """A `keys` record as the plan writes it."""
    return encode(KeyState(mark, ids or [], **more))


OLD_DELETED = mark_bytes(mark_for(event("0005", "deleted")))  # before marks expired
SCOPED = b"a|s3|uploads/photos/red flower.jpg"
LEGACY = b"a/uploads/photos/red flower.jpg"  # before scopes


def migrated(key: bytes, stored: bytes) -> bytes:
    found = migrated_mark(key, stored)
    assert found is not None
    return found


def grace_of(key: bytes) -> float:
    return {"a": GRACE}[mark_instance(key)]


def test_the_sweep_keeps_live_records_and_deleted_ones_within_their_end() -> None:
    live = record(with_grace(mark_for(event("0005")), NOW, GRACE), [["s3:old", NOW - 100]])
    deleted = record(with_grace(mark_for(event("0005", "deleted")), NOW, GRACE))
    assert key_revision(SCOPED, live, NOW + 10**6, grace_of) is None  # even its ids expired
    assert key_revision(SCOPED, deleted, NOW + GRACE - 0.001, grace_of) is None
    assert key_revision(SCOPED, deleted, NOW + GRACE, grace_of) == Revision(None)


@pytest.mark.parametrize(
    ("ids", "spill_until", "end"),
    [
        ([["s3:5", NOW + 60]], None, NOW + 60),  # its ids outlive the grace
        ([["s3:5", NOW + 1]], None, NOW + GRACE),  # the grace outlives its ids
        ([["s3:5", NOW + 1]], NOW + 90, NOW + 90),  # its spilled ids outlive both
    ],
)
def test_a_deleted_key_s_record_goes_at_the_latest_of_its_grace_and_its_ids(
    ids: list[list[Any]], spill_until: float | None, end: float
) -> None:
    mark = with_grace(mark_for(event("0005", "deleted")), NOW, GRACE)
    stored = record(mark, ids, spill_until=spill_until)
    assert key_revision(SCOPED, stored, end - 0.001, grace_of) is None
    assert key_revision(SCOPED, stored, end, grace_of) == Revision(None)


def test_a_record_of_ids_alone_goes_with_its_ids() -> None:
    stored = record(None, [["s3:5", NOW + 60], ["s3:6", NOW + 30]])
    assert key_revision(SCOPED, stored, NOW + 59, grace_of) is None
    assert key_revision(SCOPED, stored, NOW + 60, grace_of) == Revision(None)


@pytest.mark.parametrize("key", [SCOPED, LEGACY])
def test_the_sweep_stamps_a_deleted_mark_written_before_marks_expired(key: bytes) -> None:
    stored = migrated(key, OLD_DELETED)  # moved from `marks` at restore: no end yet
    assert FORGETTABLE_MARKER not in stored
    revision = key_revision(key, stored, NOW, grace_of)
    assert revision is not None and revision.value is not None
    stamped = decode(revision.value).mark
    assert stamped == with_grace(mark_for(event("0005", "deleted")), NOW, GRACE)
    assert record_forget_at(revision.value) == NOW + GRACE
    assert key_revision(key, revision.value, NOW + GRACE - 0.001, grace_of) is None
    assert key_revision(key, revision.value, NOW + GRACE, grace_of) == Revision(None)


def test_stamping_keeps_the_record_s_ids_and_their_expiry() -> None:
    """An old deleted mark's record that has recorded ids since (a stale event of the key)."""
    old = mark_for(event("0005", "deleted"))
    stored = record(old, [["s3:4", NOW + 60]], etag="e")
    revision = key_revision(SCOPED, stored, NOW, grace_of)
    assert revision is not None and revision.value is not None
    assert decode(revision.value) == KeyState(
        with_grace(old, NOW, GRACE), [["s3:4", NOW + 60]], "e"
    )
    assert record_forget_at(revision.value) == NOW + 60


def test_the_sweep_leaves_markers_and_unreadable_records_alone() -> None:
    for marker in (LEGACY_UNTIL_KEY, SEEN_UNTIL_KEY):
        assert key_revision(marker, b"1800000000.000", NOW, grace_of) is None
        # Never a key's record, whatever it holds.
        assert key_revision(marker, record(None, [["s3:5", NOW - 1]]), NOW, grace_of) is None
        assert key_revision(marker, migrated(SCOPED, OLD_DELETED), NOW, grace_of) is None
    assert key_revision(SCOPED, b"deleted, but no JSON", NOW, grace_of) is None
    assert key_revision(SCOPED, b'{"x": "soon", "m": "deleted"}', NOW, grace_of) is None


def test_the_restore_readers_date_only_what_ends() -> None:
    """`keys`: `record_forget_at`; ended records are skipped, live ones restored."""
    deleted = with_grace(mark_for(event("0005", "deleted")), NOW, GRACE)
    assert record_forget_at(record(deleted)) == NOW + GRACE
    assert record_forget_at(record(mark_for(event("0005")), [["s3:5", NOW]])) is None
    assert record_forget_at(migrated(SCOPED, OLD_DELETED)) is None  # not stamped yet
    assert record_forget_at(b"1800000000.000") is None


# --- the upgrade to per-key state: `marks` entries become `keys` records ------------------


@pytest.mark.parametrize("key", [SCOPED, LEGACY])
@pytest.mark.parametrize(
    "mark",
    [
        mark_for(event("0005")),
        with_grace(mark_for(event("0005", "deleted")), NOW, GRACE),
        mark_for(event("0005", "deleted")),
    ],
)
def test_a_marks_entry_becomes_a_record_holding_that_mark(key: bytes, mark: Mark) -> None:
    found = migrated(key, mark_bytes(mark))
    assert decode(found) == KeyState(mark)  # no ids, no ETag: only the mark moved
    # It ends as the mark did: a stamped deleted mark's grace; never, for the others.
    assert record_forget_at(found) == mark_forget_at(mark_bytes(mark))


def test_a_gcs_mark_past_64_bits_is_migrated_whole() -> None:
    mark = Mark("gcs-generation", (2**70, 2, 1), None, "gcs:x", "created")
    assert decode(migrated(SCOPED, mark_bytes(mark))).mark == mark


def test_the_pre_scope_window_marker_is_copied_as_it_is() -> None:
    assert migrated_mark(LEGACY_UNTIL_KEY, b"1800000000.000") == b"1800000000.000"


@pytest.mark.parametrize("stored", [b"not json", b"[]", b'"mark"', b'{"token": 5}'])
def test_an_unreadable_marks_entry_is_not_migrated(stored: bytes) -> None:
    assert migrated_mark(SCOPED, stored) is None


def test_the_restore_reader_dates_only_stamped_deleted_marks() -> None:
    deleted = with_grace(mark_for(event("0005", "deleted")), NOW, GRACE)
    assert mark_forget_at(mark_bytes(deleted)) == NOW + GRACE
    assert mark_forget_at(OLD_DELETED) is None
    assert mark_forget_at(mark_bytes(mark_for(event("0005")))) is None
    assert mark_forget_at(b"1800000000.000") is None


def test_the_instance_of_either_key_form() -> None:
    assert mark_instance(SCOPED) == mark_instance(LEGACY) == "a"
    assert mark_instance(b"tenant-1.x|azure@acct|c/a|b/c") == "tenant-1.x"


def test_the_store_scan_returns_what_the_sweep_changes(tmp_path: Path) -> None:
    store = StateStore(tmp_path, {KEYS: "keys-changelog"})
    store.open([0])
    try:
        live = record(mark_for(event("0005")), [["s3:5", NOW - 100]])
        due = record(with_grace(mark_for(event("0005", "deleted")), NOW - GRACE, GRACE))
        kept = record(
            with_grace(mark_for(event("0005", "deleted")), NOW - GRACE, GRACE),
            [["s3:5", NOW + 1]],
        )
        store.apply(
            {
                (KEYS, 0): {
                    b"a|s3|b/live": live,
                    b"a|s3|b/due": due,
                    b"a|s3|b/ids-live": kept,
                    b"a/b/old": migrated(b"a/b/old", OLD_DELETED),
                    LEGACY_UNTIL_KEY: b"1700000000.000",
                    SEEN_UNTIL_KEY: b"1700000000.000",
                }
            }
        )
        found = store.revisions(
            KEYS, 0, 10, lambda key, value: key_revision(key, value, NOW, grace_of)
        ).changes
        assert set(found) == {b"a|s3|b/due", b"a/b/old"}
        assert found[b"a|s3|b/due"] is None
        assert record_forget_at(found[b"a/b/old"] or b"") == NOW + GRACE
        assert len(store.revisions(KEYS, 0, 1, lambda key, value: Revision(None)).changes) == 1
    finally:
        store.close()


# --- the setting ---------------------------------------------------------------------------


def test_the_grace_comes_from_the_environment_as_seconds() -> None:
    settings = load_settings(None, environ={"STREAMS_DELETED_MARK_GRACE_S": "90"})
    assert settings.stream.deleted_mark_grace_s == 90.0
    assert load_settings(None, environ={}).stream.deleted_mark_grace_s is None


@pytest.mark.parametrize("value", ["0", "soon", "-5"])
def test_a_wrong_grace_stops_start_up_naming_the_field(value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(None, environ={"STREAMS_DELETED_MARK_GRACE_S": value})
    message = str(raised.value)
    assert "stream.deleted_mark_grace_s" in message
    assert "STREAMS_DELETED_MARK_GRACE_S" in message


def test_a_grace_in_the_file_takes_a_duration(tmp_path: Path) -> None:
    config = tmp_path / "streams.toml"
    config.write_text('[stream]\ndeleted_mark_grace_s = "2h"\n')
    assert load_settings(config, environ={}).stream.deleted_mark_grace_s == 7200.0


def test_a_bounded_scan_resumes_where_it_stopped_and_covers_the_table(tmp_path: Path) -> None:
    store = StateStore(tmp_path, {MARKS: "marks-changelog"})
    store.open([0])
    try:
        keys = [f"a|s3|b/{index}".encode() for index in range(5)]
        store.apply({(MARKS, 0): dict.fromkeys(keys, OLD_DELETED)})

        def everything(key: bytes, value: bytes) -> Revision:
            return Revision(None)

        slices = [set(store.revisions(MARKS, 0, 100, everything, scan=2).changes) for _ in range(3)]
        assert slices == [set(keys[0:2]), set(keys[2:4]), {keys[4]}]
        assert set(store.revisions(MARKS, 0, 100, everything, scan=2).changes) == set(keys[0:2])
        # A full `limit` stops the scan there too; the next call goes on from that key.
        assert set(store.revisions(MARKS, 0, 1, everything).changes) == {keys[2]}
        assert set(store.revisions(MARKS, 0, 100, everything).changes) == set(keys[3:])
    finally:
        store.close()


def test_a_live_mark_is_kept_even_if_it_carried_a_forget_time() -> None:
    odd = Mark("aws-sequencer", ("0005".ljust(64, "0"),), None, "s3:y", "created", NOW)
    assert not forgotten(odd, NOW + 10**6)
    assert with_grace(odd, NOW, GRACE).forget_at is None
