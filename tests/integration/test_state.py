"""Dedupe state across restarts, and its TTL, on the real broker and real RocksDB."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
import rocksdict
from support.kafka_io import produce, raw, read_topic
from support.payloads import s3_body, s3_record
from support.worker import Topology, Worker

from streams.core.keystate import RECENT_IDS, decode

pytestmark = pytest.mark.kafka


def stored_keys(data_dir: Path, table: str) -> set[bytes]:
    """Every key in a stopped worker's RocksDB databases of `table`, all partitions."""
    keys: set[bytes] = set()
    paths = sorted(data_dir.rglob(f"{table}-*.db"))
    assert paths, f"no RocksDB database of table {table} under {data_dir}"
    for path in paths:
        options = rocksdict.Options(raw_mode=True)
        db = rocksdict.Rdict(
            str(path), options=options, access_type=rocksdict.AccessType.read_only()
        )
        try:
            keys.update(key for key in db.keys() if not key.startswith(b"\x00"))  # noqa: SIM118
        finally:
            db.close()
    return keys


def stored_values(data_dir: Path, table: str) -> dict[bytes, bytes]:
    """Every entry of a stopped worker's `table`, all partitions, markers left out."""
    found: dict[bytes, bytes] = {}
    for path in sorted(data_dir.rglob(f"{table}-*.db")):
        options = rocksdict.Options(raw_mode=True)
        db = rocksdict.Rdict(
            str(path), options=options, access_type=rocksdict.AccessType.read_only()
        )
        try:
            found.update((key, value) for key, value in db.items() if not key.startswith(b"\x00"))
        finally:
            db.close()
    return found


def output_ids(bootstrap: str, topic: str) -> list[str]:
    return [read.json()["id"] for read in asyncio.run(read_topic(bootstrap, topic))]


def test_a_redelivery_after_a_restart_with_restored_state_is_still_dropped(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    config = names.config()
    key = f"restart/{uuid.uuid4().hex[:8]}"
    change = s3_body(s3_record(key, "0055AED6DCD90281E5"))
    output = names.output("default")

    first = Worker(kafka_bootstrap, config, tmp_path / "first").start()
    try:
        asyncio.run(produce(kafka_bootstrap, names.raw, [raw(change, "s3")]))
        first.wait_metric("storage_events_emitted_total", 1)
    finally:
        assert first.stop() == 0, first.tail()

    # A new machine: empty data directory, so the state can only come from the changelog.
    second = Worker(kafka_bootstrap, config, tmp_path / "second").start()
    try:
        sentinel = s3_body(s3_record(key, "0055AED6DCD90281F0"))
        asyncio.run(
            produce(
                kafka_bootstrap,
                names.raw,
                [raw(change, "s3"), raw(sentinel, "s3")],
                key=key.encode(),
            )
        )
        second.wait_metric("storage_events_emitted_total", 1)
        assert second.wait_metric("storage_events_duplicates_total", 1) == 1
    finally:
        assert second.stop() == 0, second.tail()
    assert len(output_ids(kafka_bootstrap, output)) == 2


def test_ids_past_their_ttl_are_forgotten_locally_and_in_the_changelog(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A hot key: more changes than its record keeps (RECENT_IDS). The oldest ids move to
    `seen` and still make their redeliveries duplicates; past the TTL the sweeper forgets them
    locally and tombstones them in the changelog, and a restore does not bring them back.
    The key's own record stays (a live key's mark), holding at most RECENT_IDS ids."""
    names = Topology()
    config = names.config(
        [{"name": "default", "dedupe_ttl": "4s"}], extra="dedupe_sweep_interval_s = 0.5"
    )
    key = f"ttl/{uuid.uuid4().hex[:8]}"
    changes = [s3_body(s3_record(key, f"0055AED6DCD9028{n:03X}")) for n in range(RECENT_IDS + 2)]
    output = names.output("default")

    first = Worker(kafka_bootstrap, config, tmp_path / "first").start()
    try:
        deliveries = [raw(change, "s3") for change in [*changes, changes[0]]]
        asyncio.run(produce(kafka_bootstrap, names.raw, deliveries, key=key.encode()))
        first.wait_metric("storage_events_emitted_total", len(changes))
        first.wait_metric("storage_events_duplicates_total", 1)  # a spilled id, within the TTL
        first.wait_metric("storage_events_dedupe_expired_total", 2, timeout_s=30)
    finally:
        assert first.stop() == 0, first.tail()
    ids = output_ids(kafka_bootstrap, output)
    assert len(ids) == len(changes)
    spilled = [f"default/{event_id}".encode() for event_id in ids[:2]]
    assert not set(spilled) & stored_keys(tmp_path / "first", "seen")
    [record] = stored_values(tmp_path / "first", "keys").values()
    assert [entry[0] for entry in decode(record).ids] == ids[2:]

    changelog = asyncio.run(read_topic(kafka_bootstrap, f"{names.app_id}-seen-changelog"))
    for seen_key in spilled:
        history = [read.value for read in changelog if read.key == seen_key]
        assert len(history) == 2 and history[0] is not None and history[-1] is None, history

    # Restore from the changelog alone: the expired ids must not come back into the store.
    second = Worker(kafka_bootstrap, config, tmp_path / "second").start()
    assert second.stop() == 0, second.tail()
    assert not set(spilled) & stored_keys(tmp_path / "second", "seen")
    assert stored_values(tmp_path / "second", "keys") == stored_values(tmp_path / "first", "keys")
