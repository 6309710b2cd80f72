"""Produce raw deliveries and read topics back, against the real broker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from support.event_schema import check_record

Header = tuple[str, bytes]


@dataclass(frozen=True)
class Read:
    """One record read back."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    header_lines: tuple[tuple[str, bytes], ...] = ()
    """The headers as Kafka holds them, repeats and order kept."""

    def json(self) -> Any:
        return json.loads(self.value or b"null")


async def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes, Sequence[Header]]],
    key: bytes | None = None,
) -> None:
    """Publish raw records in order; one `key` keeps them on one partition, in order."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, headers=list(headers))
            for value, headers in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def produce_to(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes]]) -> None:
    """(partition, key, value) records, each to its partition, in order (a changelog as a
    worker of an earlier version wrote it)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for partition, key, value in records:
            await producer.send_and_wait(topic, value, key=key, partition=partition)
    finally:
        await producer.stop()


async def create_topic(
    bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config or {})])
    finally:
        await admin.close()


def raw(value: bytes | str, source: str, **headers: str) -> tuple[bytes, list[Header]]:
    """A raw delivery as a bridge publishes it; `header_x=...` become `header.x` headers."""
    body = value.encode() if isinstance(value, str) else value
    out: list[Header] = [("source", source.encode())]
    for name, text in headers.items():
        prefix, _, rest = name.partition("_")
        out.append((f"{prefix}.{rest.replace('_', '-')}" if rest else prefix, text.encode()))
    return body, out


async def read_topic(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[Read]:
    """Every record of `topic` from the beginning up to its end offsets at call time."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        await consumer._client.add_topic(topic)  # track its metadata without subscribing
        partitions = consumer.partitions_for_topic(topic) or set()
        assignment = [TopicPartition(topic, partition) for partition in sorted(partitions)]
        if not assignment:
            return []
        consumer.assign(assignment)
        await consumer.seek_to_beginning(*assignment)
        ends = await consumer.end_offsets(assignment)
        records: list[Read] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s

        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in assignment])

        while await behind():
            if loop.time() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end offsets")
            batches = await consumer.getmany(timeout_ms=500)
            for messages in batches.values():
                for message in messages:
                    headers = dict(message.headers)
                    # an output or stale record must match the schema it names
                    check_record(message.topic, message.offset, message.value, headers)
                    records.append(
                        Read(
                            message.topic,
                            message.partition,
                            message.offset,
                            message.key,
                            message.value,
                            headers,
                            tuple(message.headers),
                        )
                    )
        return sorted(records, key=lambda read: (read.partition, read.offset))
    finally:
        await consumer.stop()


async def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """partition -> the group's committed offset, for the partitions it committed."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}


WRITE_HEADER_NAME = """
import asyncio, sys
from aiokafka import AIOKafkaProducer

class Raw(str):
    def encode(self, *args, **kwargs):
        return bytes.fromhex(sys.argv[5])

async def main(bootstrap, topic, partition, key_hex, name_hex, value_hex):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        sent = await producer.send_and_wait(
            topic,
            bytes.fromhex(value_hex),
            key=bytes.fromhex(key_hex),
            headers=[(Raw("x"), b"1")],
            partition=partition,
        )
    finally:
        await producer.stop()
    print(sent.offset)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]))
"""


def write_header_name(
    bootstrap: str, topic: str, partition: int, key: bytes, name: bytes, value: bytes
) -> int:
    """One record whose only header is named `name` (any bytes: Kafka allows them, and no
    client of the product writes such a name); its offset. aiokafka's pure-Python producer
    writes it, in a process of its own (`AIOKAFKA_NO_EXTENSIONS`)."""
    done = subprocess.run(
        [
            sys.executable,
            *("-c", WRITE_HEADER_NAME, bootstrap, topic, str(partition)),
            *(key.hex(), name.hex(), value.hex()),
        ],
        env={**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return int(done.stdout.strip())
