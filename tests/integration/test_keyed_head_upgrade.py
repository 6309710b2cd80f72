"""A worker upgraded in place reads what the previous releases left in its repartition topic:
keyed records without a head (the release before the head) and of the first format, beside
records with a head (streams.core.keyedhead). Each is emitted once, byte for byte the event's
JSON, and an id seen in one format is a duplicate in another."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from support.kafka_io import produce, read_topic
from support.worker import Topology, Worker

from streams.core.event import FileEvent
from streams.core.records import KEYED_HEAD_HEADER, OutRecord, event_json, keyed_record
from streams.engine.topics import ensure_topics, topology

pytestmark = pytest.mark.kafka


def _event(name: str, sequencer: str) -> FileEvent:
    return FileEvent(
        id=f"s3:{uuid.uuid4().hex}",
        type="created",
        key=f"upgrade/{name}-{uuid.uuid4().hex[:8]}.txt",
        bucket="uploads",
        provider="s3",
        sequencer=sequencer,
        size=3,
        raw={"awsRegion": "eu-west-1", "eventName": "ObjectCreated:Put"},
    )


def _without_head(record: OutRecord) -> OutRecord:
    """The record as the release before the head wrote it."""
    headers = tuple((name, value) for name, value in record.headers if name != KEYED_HEAD_HEADER)
    assert len(headers) == len(record.headers) - 1
    return OutRecord(record.topic, record.key, record.value, headers)


def _first_format(record: OutRecord, event: FileEvent) -> OutRecord:
    """The record as the first release wrote it: the instance inside the value."""
    value = json.dumps({"instance": "default", "event": event.model_dump(mode="json")}).encode()
    return OutRecord(record.topic, record.key, value, (("received-at", b"1764461287000"),))


def _commit_start(bootstrap: str, group: str, topic: str, partitions: int) -> None:
    """The emit group's committed offsets as the previous worker left them: at the start."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    offsets = [TopicPartition(topic, p, 0) for p in range(partitions)]
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()


def test_keyed_records_of_every_format_are_emitted_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    settings = names.settings()
    repartition = settings.stream.repartition_topic
    with_head, previous, first = _event("head", "0A"), _event("nohead", "0B"), _event("first", "0C")
    records = [
        keyed_record(repartition, "default", with_head, b"1764461287000"),
        _without_head(keyed_record(repartition, "default", previous, b"1764461287000")),
        _first_format(keyed_record(repartition, "default", first, None), first),
        # The previous release's record again, now with a head: a duplicate of its id.
        keyed_record(repartition, "default", previous, b"1764461287000"),
    ]
    assert [KEYED_HEAD_HEADER in dict(r.headers) for r in records] == [True, False, False, True]

    async def as_the_old_worker_left_it() -> None:
        await ensure_topics(kafka_bootstrap, topology(settings))
        for record in records:
            await produce(
                kafka_bootstrap,
                repartition,
                [(record.value or b"", list(record.headers))],
                record.key,
            )

    asyncio.run(as_the_old_worker_left_it())
    _commit_start(kafka_bootstrap, f"{names.app_id}-emit", repartition, settings.stream.partitions)

    worker = Worker(kafka_bootstrap, names.config(), tmp_path)
    worker.start()
    try:
        worker.wait_metric("storage_events_emitted_total", 3, instance="default")
        worker.wait_metric("storage_events_duplicates_total", 1, instance="default")
        dead = worker.metric("storage_events_dead_lettered_total")
    finally:
        assert worker.stop() == 0, worker.tail()
    assert dead == 0
    output = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
    by_key = {record.key: record for record in output}
    assert len(output) == 3
    for event in (with_head, previous, first):
        read = by_key[event.key.encode()]
        assert read.value == event_json(event)
        headers = dict(read.headers)
        assert headers["ce_id"] == event.id.encode()
        assert KEYED_HEAD_HEADER not in headers
