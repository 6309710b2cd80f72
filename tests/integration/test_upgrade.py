"""Upgrading from the two Faust agents: the stages start where the old consumer group stopped."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from support.kafka_io import produce, raw, read_topic
from support.payloads import s3_body, s3_record
from support.worker import Topology, Worker

from streams.engine.offsets import adopt_committed_offsets
from streams.engine.topics import ensure_topics, topology

pytestmark = pytest.mark.kafka


async def commit_as(bootstrap: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(offsets)
    finally:
        await consumer.stop()


async def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends: dict[TopicPartition, int] = await consumer.end_offsets(
            [TopicPartition(topic, p) for p in range(partitions)]
        )
        return ends
    finally:
        await consumer.stop()


def test_a_worker_upgraded_from_the_faust_agents_goes_on_where_they_stopped(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    config = names.config()
    old = s3_body(s3_record(f"old/{uuid.uuid4().hex[:8]}", "0055AED6DCD90281E5"))
    new = s3_body(s3_record(f"new/{uuid.uuid4().hex[:8]}", "0055AED6DCD90281E5"))

    async def as_the_old_worker_left_it() -> None:
        settings = names.settings()
        await ensure_topics(kafka_bootstrap, topology(settings))
        # A delivery the old worker had handled: its offset committed by the old group.
        await produce(kafka_bootstrap, names.raw, [raw(old, "s3")], key=b"one partition")
        await commit_as(
            kafka_bootstrap, names.app_id, await end_offsets(kafka_bootstrap, names.raw, 2)
        )

    asyncio.run(as_the_old_worker_left_it())
    worker = Worker(kafka_bootstrap, config, tmp_path / "worker").start()
    try:
        # Behind the old delivery in its partition: read after it, were it read again.
        asyncio.run(produce(kafka_bootstrap, names.raw, [raw(new, "s3")], key=b"one partition"))
        worker.wait_metric("storage_events_emitted_total", 1)
        received = worker.metric("storage_events_received_total")
    finally:
        assert worker.stop() == 0, worker.tail()
    keys = [
        read.json()["key"]
        for read in asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
    ]
    assert [key.split("/")[0] for key in keys] == ["new"]
    assert received == 1, "the delivery the old group had committed was read again"


def test_offsets_are_adopted_only_by_a_group_without_its_own(kafka_bootstrap: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, old_group, new_group = f"adopt-{suffix}", f"old-{suffix}", f"new-{suffix}"

    async def scenario() -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        await produce(kafka_bootstrap, topic, [raw(b"{}", "s3")] * 3, key=b"k")
        ends = await end_offsets(kafka_bootstrap, topic, 1)
        await commit_as(kafka_bootstrap, old_group, ends)
        first = await adopt_committed_offsets(kafka_bootstrap, old_group, new_group, [topic])
        await commit_as(kafka_bootstrap, old_group, {TopicPartition(topic, 0): 1})
        second = await adopt_committed_offsets(kafka_bootstrap, old_group, new_group, [topic])
        return first, second

    first, second = asyncio.run(scenario())
    assert first == {TopicPartition(topic, 0): 3}
    assert second == {}
