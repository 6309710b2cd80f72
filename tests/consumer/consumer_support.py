"""Helpers of the consumer-library tests: topics, canonical events, committed offsets."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord, RecordMetadata
from support.kafka_io import committed as committed  # shared with the worker tests

from fileevents import FileEvents
from streams.core.event import FileEvent

Header = tuple[str, bytes]
NullableHeader = tuple[str, bytes | None]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def event(key: str, seq: int, type_: str = "created", id_: str | None = None) -> FileEvent:
    """A canonical event of `key`; `seq` becomes its sequencer (and, by default, its id)."""
    return FileEvent.model_validate(
        {
            "id": id_ or f"s3:{key}:{seq}",
            "type": type_,
            "key": key,
            "bucket": "uploads",
            "size": 10 + seq if type_ == "created" else None,
            "time": datetime(2026, 11, 30, 0, 0, seq % 60, tzinfo=UTC),
            "sequencer": f"{seq:08d}",
            "provider": "s3",
            "raw": {"seq": seq},
        }
    )


def ce_headers(item: FileEvent, instance: str = "test") -> list[Header]:
    """CloudEvents binary-mode headers, as the stream writes them."""
    return [
        ("ce_specversion", b"1.0"),
        ("ce_id", item.id.encode()),
        ("ce_type", f"storage.object.{item.type}".encode()),
        ("ce_source", f"/storage-events/{instance}/{item.provider}".encode()),
        ("ce_subject", item.key.encode()),
        ("content-type", b"application/json"),
    ]


async def create_topics(bootstrap: str, *specs: tuple[str, int]) -> None:
    """Create each `(name, partitions)` topic."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name, num_partitions=count, replication_factor=1) for name, count in specs]
        )
    finally:
        await admin.close()


async def produce_events(
    bootstrap: str, topic: str, events: Sequence[FileEvent | tuple[str, bytes]]
) -> list[RecordMetadata]:
    """Write events (keyed by object key) in order, or `(key, raw value)` pairs as given."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        futures = []
        for item in events:
            if isinstance(item, FileEvent):
                key, value, headers = item.key, item.model_dump_json().encode(), ce_headers(item)
            else:
                key, value, headers = item[0], item[1], []
            futures.append(await producer.send(topic, value, key=key.encode(), headers=headers))
        return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


async def produce_records(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes | None, Sequence[NullableHeader]]],
    max_request_size: int = 1048576,
    partition: int | None = None,
    transactional: bool = False,
) -> list[RecordMetadata]:
    """Write `(key, value, headers)` records in order, byte for byte, as an attacker
    with write access to the topic would: any key, any value, null header values.
    `transactional`: in one committed transaction, as the stream writes its events."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        max_request_size=max_request_size,
        transactional_id=unique("writer") if transactional else None,
    )
    await producer.start()
    try:
        if transactional:
            await producer.begin_transaction()
        futures = [
            await producer.send(topic, value, key=key, headers=list(headers), partition=partition)
            for key, value, headers in records
        ]
        sent = list(await asyncio.gather(*futures))
        if transactional:
            await producer.commit_transaction()
        return sent
    finally:
        await producer.stop()


async def read_records(bootstrap: str, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of `topic` up to its end offsets now, as read: headers as a list (in
    order, repeated names and null values kept), key and value as bytes."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        fetch_max_bytes=8 * 1024 * 1024,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    await consumer.start()
    try:
        await consumer._client.add_topic(topic)
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        records: list[ConsumerRecord[bytes, bytes]] = []
        deadline = asyncio.get_running_loop().time() + 30
        while any([await consumer.position(tp) < ends[tp] for tp in partitions]):
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end offsets")
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(batch)
        return sorted(records, key=lambda record: (record.partition, record.offset))
    finally:
        await consumer.stop()


async def produce_aborted(bootstrap: str, topic: str, events: Sequence[FileEvent]) -> None:
    """Write events in a Kafka transaction, then abort it: read_committed never sees them."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("aborted"))
    await producer.start()
    try:
        await producer.begin_transaction()
        for item in events:
            await producer.send_and_wait(
                topic, item.model_dump_json().encode(), key=item.key.encode()
            )
        await producer.abort_transaction()
    finally:
        await producer.stop()


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> end offset (past any transaction markers)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        await consumer._client.add_topic(topic)  # its metadata, without subscribing
        partitions = consumer.partitions_for_topic(topic) or set()
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in ends.items()}


async def reset_offsets(bootstrap: str, group: str, topic: str) -> None:
    """Commit offset 0 on every partition for `group` (which must have no live member)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        await consumer._client.add_topic(topic)
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        await consumer.commit({tp: 0 for tp in partitions})
    finally:
        await consumer.stop()


async def eventually(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll `condition` (every 20 ms) until it is truthy; fail naming `what`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.02)


async def run_until(
    events: FileEvents, condition: Callable[[], object], what: str, timeout_s: float = 30.0
) -> None:
    """Run `events` until `condition` holds, then stop it gracefully and wait for `run`."""
    task = asyncio.create_task(events.run())
    try:
        await eventually(lambda: task.done() or condition(), timeout_s, what)
        if task.done():
            task.result()  # raise what stopped it early
            raise AssertionError(f"run() returned before {what}")
    finally:
        events.stop()
        await asyncio.wait_for(task, 30)


def fetched(offset: int, key: bytes) -> ConsumerRecord[bytes, bytes]:
    """A record as the fetch loop hands it to the dispatcher (topic `t`, partition 0)."""
    return ConsumerRecord(
        topic="t",
        partition=0,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=key,
        value=b"{}",
        checksum=None,
        serialized_key_size=len(key),
        serialized_value_size=2,
        headers=(),
    )
