"""The state binding's decisions (streams/engine/binding.py) and the store's discard, on real
RocksDB."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from streams.engine.binding import BINDING_FILE, Binding, mismatch, read_binding, write_binding
from streams.engine.store import StateStore

CHANGELOGS = {"seen": "app-seen-changelog", "marks": "app-marks-changelog"}
HERE = Binding("cluster-a", {"app-seen-changelog": "seen-1", "app-marks-changelog": "marks-1"})


def test_the_same_cluster_and_topics_keep_the_state() -> None:
    assert mismatch(HERE, HERE, has_state=True) is None


def test_another_cluster_discards_it_and_names_both() -> None:
    elsewhere = Binding("cluster-b", dict(HERE.topic_ids))
    reason = mismatch(HERE, elsewhere, has_state=True)
    assert reason is not None
    assert "cluster-a" in reason and "cluster-b" in reason


def test_a_changelog_created_again_discards_it_and_names_the_topic() -> None:
    recreated = Binding("cluster-a", {**HERE.topic_ids, "app-seen-changelog": "seen-2"})
    reason = mismatch(HERE, recreated, has_state=True)
    assert reason is not None
    assert "app-seen-changelog" in reason and "seen-1" in reason and "seen-2" in reason


def test_state_without_a_record_is_not_trusted_but_no_state_needs_none() -> None:
    assert mismatch(None, HERE, has_state=True) is not None
    assert mismatch(None, HERE, has_state=False) is None


def test_an_id_the_broker_does_not_give_is_not_compared() -> None:
    no_ids = Binding("cluster-a", dict.fromkeys(HERE.topic_ids))
    assert mismatch(HERE, no_ids, has_state=True) is None
    assert mismatch(no_ids, HERE, has_state=True) is None
    assert mismatch(no_ids, Binding("cluster-b", no_ids.topic_ids), has_state=True) is not None


def test_the_record_round_trips_and_a_damaged_one_reads_as_none(tmp_path: Path) -> None:
    write_binding(tmp_path, HERE)
    assert read_binding(tmp_path) == HERE
    (tmp_path / BINDING_FILE).write_text("{not json")
    assert read_binding(tmp_path) is None
    (tmp_path / BINDING_FILE).write_text('{"topic_ids": {}}')
    assert read_binding(tmp_path) is None


def written_store(directory: Path) -> StateStore:
    store = StateStore(directory, CHANGELOGS)
    store.open([0, 1])
    store.apply({("seen", 0): {b"s3:id": b"1"}, ("marks", 1): {b"key": b"mark"}})
    return store


def test_bind_discards_every_database_once_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = written_store(tmp_path)
    assert store.bind(HERE) is not None  # state that records no origin
    store.open([0, 1])
    store.apply({("seen", 0): {b"s3:id": b"1"}})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streams.engine.store"):
        assert store.bind(HERE) is None
        assert store.partitions() == [0, 1]  # kept open, nothing discarded
        reason = store.bind(Binding("cluster-b", dict(HERE.topic_ids)))
    assert reason is not None and "cluster-b" in reason
    assert [record.getMessage() for record in caplog.records] == [
        f"local state in {tmp_path} discarded, restoring it from the changelogs: {reason}"
    ]
    assert sorted(tmp_path.glob("*.db")) == []
    assert read_binding(tmp_path) == Binding("cluster-b", dict(HERE.topic_ids))
    store.open([0])
    assert store.get("seen", 0, b"s3:id") is None
    assert store.changelog_offset("seen", 0) is None  # a restore starts at the beginning
    store.close()


def test_bind_says_once_that_a_broker_without_topic_ids_binds_the_cluster_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = StateStore(tmp_path, CHANGELOGS)
    no_ids = Binding("cluster-a", dict.fromkeys(CHANGELOGS.values()))
    with caplog.at_level(logging.WARNING, logger="streams.engine.store"):
        assert store.bind(no_ids) is None
        assert store.bind(no_ids) is None
    assert len(caplog.records) == 1
    assert "cluster id only" in caplog.records[0].getMessage()
