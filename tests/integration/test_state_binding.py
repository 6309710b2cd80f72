"""Local state is bound to the cluster and the changelog topics it came from (issue 16, 1).

A state directory reused against changelog topics deleted and created again under the same
names, or against another cluster, must not make a first delivery count as a duplicate: the
worker discards the local copy, restores from the (new) changelog and says so in one line.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from support.kafka_io import produce, raw, read_topic
from support.local_broker import PrivateBroker
from support.payloads import s3_body, s3_record
from support.worker import Topology, Worker, wait_for

from streams.engine.topics import KEYS_TABLE, MARKS_TABLE, SEEN_TABLE, changelog_topic, topology

pytestmark = pytest.mark.kafka

DISCARDED = "discarded, restoring it from the changelogs"


def discard_lines(worker: Worker) -> list[str]:
    return [line for line in worker.log_path.read_text().splitlines() if DISCARDED in line]


def handled(worker: Worker) -> tuple[float, float] | None:
    """(emitted, duplicates) once the worker decided about at least one event."""
    emitted = worker.metric("storage_events_emitted_total")
    duplicates = worker.metric("storage_events_duplicates_total")
    return (emitted, duplicates) if emitted + duplicates >= 1 else None


def emit_once(bootstrap: str, names: Topology, state: Path, workdir: Path, change: bytes) -> None:
    """A worker on `bootstrap` with state directory `state` emits `change`, then stops."""
    worker = Worker(bootstrap, names.config(), workdir, env={"STREAMS_DATA_DIR": str(state)})
    worker.start()
    try:
        asyncio.run(produce(bootstrap, names.raw, [raw(change, "s3")]))
        worker.wait_metric("storage_events_emitted_total", 1)
    finally:
        assert worker.stop() == 0, worker.tail()
    assert (state / f"{names.app_id}-state" / "binding.json").exists()


def second_delivery(
    bootstrap: str, names: Topology, state: Path, workdir: Path, change: bytes
) -> Worker:
    """A worker on `bootstrap` with the same state directory gets `change` again; stopped."""
    worker = Worker(bootstrap, names.config(), workdir, env={"STREAMS_DATA_DIR": str(state)})
    worker.start()
    try:
        asyncio.run(produce(bootstrap, names.raw, [raw(change, "s3")]))
        emitted, duplicates = wait_for(lambda: handled(worker), 60, "the worker to handle it")
        assert (emitted, duplicates) == (1, 0), worker.tail()
    finally:
        assert worker.stop() == 0, worker.tail()
    return worker


async def delete_everything_of(bootstrap: str, names: Topology) -> None:
    """What a new broker would not have: the stream's topics (the broker drops the groups'
    committed offsets of a deleted topic with it)."""
    topics = [spec.name for spec in topology(names.settings())]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(topics)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while set(topics) & set(await admin.list_topics()):
            assert loop.time() < deadline, "the topics were not deleted within 60 s"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


def test_changelog_topics_created_again_under_the_same_names_discard_local_state(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    change = s3_body(s3_record(f"bound/{uuid.uuid4().hex[:8]}", "0055AED6DCD90281E5"))
    state = tmp_path / "state"
    emit_once(kafka_bootstrap, names, state, tmp_path / "first", change)

    asyncio.run(delete_everything_of(kafka_bootstrap, names))

    second = second_delivery(kafka_bootstrap, names, state, tmp_path / "second", change)
    lines = discard_lines(second)
    assert len(lines) == 1, second.tail()
    assert "was deleted and created again" in lines[0]
    settings = names.settings()
    changelogs = [
        changelog_topic(settings, table) for table in (KEYS_TABLE, SEEN_TABLE, MARKS_TABLE)
    ]
    assert any(f"changelog topic {topic} " in lines[0] for topic in changelogs), lines[0]
    output = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
    assert len(output) == 1


def test_a_kept_binding_discards_nothing_on_a_restart(kafka_bootstrap: str, tmp_path: Path) -> None:
    names = Topology()
    change = s3_body(s3_record(f"kept/{uuid.uuid4().hex[:8]}", "0055AED6DCD90281E5"))
    state = tmp_path / "state"
    emit_once(kafka_bootstrap, names, state, tmp_path / "first", change)

    again = Worker(
        kafka_bootstrap, names.config(), tmp_path / "again", env={"STREAMS_DATA_DIR": str(state)}
    ).start()
    try:
        asyncio.run(produce(kafka_bootstrap, names.raw, [raw(change, "s3")]))
        assert wait_for(lambda: handled(again), 60, "the worker to handle it") == (0, 1)
    finally:
        assert again.stop() == 0, again.tail()
    assert discard_lines(again) == []
    assert "restored: 0 changelog records" in again.log_path.read_text()


def test_state_from_another_cluster_is_discarded(kafka_bootstrap: str, tmp_path: Path) -> None:
    names = Topology()
    change = s3_body(s3_record(f"moved/{uuid.uuid4().hex[:8]}", "0055AED6DCD90281E5"))
    state = tmp_path / "state"
    emit_once(kafka_bootstrap, names, state, tmp_path / "first", change)

    broker = PrivateBroker(tmp_path / "other-broker")
    other = broker.start()
    try:
        second = second_delivery(other, names, state, tmp_path / "second", change)
    finally:
        broker.stop()
    lines = discard_lines(second)
    assert len(lines) == 1, second.tail()
    assert "it was written against Kafka cluster" in lines[0]
