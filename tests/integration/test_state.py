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
    names = Topology()
    config = names.config(
        [{"name": "default", "dedupe_ttl": "4s"}], extra="dedupe_sweep_interval_s = 0.5"
    )
    key = f"ttl/{uuid.uuid4().hex[:8]}"
    change = s3_body(s3_record(key, "0055AED6DCD90281E5"))
    output = names.output("default")

    first = Worker(kafka_bootstrap, config, tmp_path / "first").start()
    try:
        asyncio.run(
            produce(
                kafka_bootstrap, names.raw, [raw(change, "s3"), raw(change, "s3")], key=key.encode()
            )
        )
        first.wait_metric("storage_events_emitted_total", 1)
        first.wait_metric("storage_events_duplicates_total", 1)  # within the TTL
        first.wait_metric("storage_events_dedupe_expired_total", 1, timeout_s=30)
    finally:
        assert first.stop() == 0, first.tail()
    [event_id] = output_ids(kafka_bootstrap, output)
    seen_key = f"default/{event_id}".encode()
    assert seen_key not in stored_keys(tmp_path / "first", "seen")

    changelog = asyncio.run(read_topic(kafka_bootstrap, f"{names.app_id}-seen-changelog"))
    history = [read.value for read in changelog if read.key == seen_key]
    assert len(history) == 2 and history[0] is not None and history[-1] is None, history

    # Restore from the changelog alone: the expired id must not come back into the store.
    second = Worker(kafka_bootstrap, config, tmp_path / "second").start()
    assert second.stop() == 0, second.tail()
    assert seen_key not in stored_keys(tmp_path / "second", "seen")
