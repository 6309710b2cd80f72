"""Produce a batch of records and wait until Kafka acknowledged every one of them.

Records are grouped per topic partition and handed to the producer as whole record batches
(`create_batch`/`send_batch`): one future and one accumulator entry per partition instead of
per record, which is most of what a per-record `send` costs in Python. Partitions are chosen
exactly as the producer would (murmur2 of the key, Java-compatible), so keys land where any
Kafka client expects them.

An idempotent producer with acks=all. When Kafka does not acknowledge (broker down, leader
moving), the partitions not acknowledged are sent again, in their order, with a growing
pause, until they are: a transient failure holds the stream back, it never becomes a drop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata

from streams import metrics
from streams.partitioning import partition_for
from streams.producer_errors import RENEW_ON
from streams.records import OutRecord
from streams.topics import RAW_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0
RENEW_AFTER_ROUNDS = 5
MAX_BATCH_BYTES = 1024 * 1024
PRODUCER_SETTINGS = {
    "acks": "all",
    "enable_idempotence": True,
    "linger_ms": 5,
    "max_batch_size": MAX_BATCH_BYTES,
    "max_request_size": RAW_MAX_MESSAGE_BYTES,  # dead letters carry whole deliveries
    "request_timeout_ms": 30_000,
}


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """Where Kafka stored the records of one topic partition that one call sent."""

    topic: str
    partition: int
    first_offset: int
    count: int

    @property
    def last_offset(self) -> int:
        return self.first_offset + self.count - 1


async def group_by_partition(
    producer: AIOKafkaProducer, records: Sequence[OutRecord]
) -> dict[tuple[str, int], list[OutRecord]]:
    """Records per (topic, partition), each list in the records' order."""
    groups: dict[tuple[str, int], list[OutRecord]] = {}
    counts: dict[str, int] = {}
    unkeyed = 0
    for record in records:
        partition = record.partition
        if partition is None:
            count = counts.get(record.topic)
            if count is None:
                await producer.client._wait_on_metadata(record.topic)
                count = len(producer.client.cluster.partitions_for_topic(record.topic))
                counts[record.topic] = count
            if record.key is not None:
                partition = partition_for(record.key, count)
            else:  # spread records without a key (a dead letter of an unkeyed delivery)
                partition, unkeyed = unkeyed % count, unkeyed + 1
        groups.setdefault((record.topic, partition), []).append(record)
    return groups


async def enqueue(
    producer: AIOKafkaProducer, topic: str, partition: int, records: Sequence[OutRecord]
) -> list[tuple[int, asyncio.Future[RecordMetadata]]]:
    """Queue `records` (all for one partition) as record batches; (count, future) per batch.

    Must be awaited inside the transaction for a transactional producer."""
    queued: list[tuple[int, asyncio.Future[RecordMetadata]]] = []
    batch = producer.create_batch()
    count = 0
    for record in records:
        headers = list(record.headers)
        if batch.append(key=record.key, value=record.value, timestamp=None, headers=headers):
            count += 1
            continue
        # The batch is full: send it and start the next one with this record, which a fresh
        # batch always takes, whatever its size.
        batch.close()
        queued.append((count, await producer.send_batch(batch, topic, partition=partition)))
        batch = producer.create_batch()
        batch.append(key=record.key, value=record.value, timestamp=None, headers=headers)
        count = 1
    if count:
        batch.close()  # complete: the producer sends it without waiting `linger_ms`
        queued.append((count, await producer.send_batch(batch, topic, partition=partition)))
    return queued


async def acknowledged(
    topic: str, partition: int, queued: list[tuple[int, asyncio.Future[RecordMetadata]]]
) -> Acknowledged:
    """Wait for every batch of one partition; where its records went."""
    first: int | None = None
    total = 0
    for count, future in queued:
        metadata = await future
        if first is None:
            first = metadata.offset
        total += count
    return Acknowledged(topic, partition, first if first is not None else -1, total)


class RecordSender:
    """The stream's producer for output, stale, dead-letter, repartition and changelog records."""

    def __init__(self, bootstrap_servers: str, client_id: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.client_id = client_id
        self._producer = self._new_producer()

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap_servers, client_id=self.client_id, **PRODUCER_SETTINGS
        )

    async def start(self) -> None:
        delay = 0.5
        while True:
            try:
                await self._producer.start()
                return
            except KafkaError as exc:
                log.warning("producer cannot reach Kafka (%r); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)

    async def stop(self) -> None:
        await self._producer.stop()

    async def _renew(self) -> None:
        """Replace a producer whose idempotence state the broker no longer accepts (after a
        broker restart aiokafka can fail every later send with OutOfOrderSequenceNumber)."""
        log.warning("renewing the producer after repeated failures")
        try:
            await self._producer.stop()
        except KafkaError:
            log.debug("stopping the old producer failed", exc_info=True)
        self._producer = self._new_producer()
        await self.start()

    async def send_all(self, records: Sequence[OutRecord]) -> list[Acknowledged]:
        """Send every record; once all are acknowledged, say where each partition's went."""
        if not records:
            return []
        done: list[Acknowledged] = []
        delay = 0.2
        failed_rounds = 0
        pending: dict[tuple[str, int], list[OutRecord]] | None = None
        while pending is None or pending:
            error: BaseException | None = None
            queued: dict[tuple[str, int], list[tuple[int, asyncio.Future[RecordMetadata]]]] = {}
            if pending is None:
                try:
                    # Needs each topic's partition count: metadata, i.e. a reachable broker.
                    pending = await group_by_partition(self._producer, records)
                except KafkaError as exc:
                    log.warning("no metadata for the records' topics (%r); retrying", exc)
                    metrics.SEND_RETRIES.inc()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_BACKOFF_S)
                    continue
            for (topic, partition), group in pending.items():
                try:
                    queued[(topic, partition)] = await enqueue(
                        self._producer, topic, partition, group
                    )
                except KafkaError as exc:
                    error = exc
                    break
            failed: dict[tuple[str, int], list[OutRecord]] = {
                place: group for place, group in pending.items() if place not in queued
            }
            for place, batches in queued.items():
                try:
                    done.append(await acknowledged(*place, batches))
                except KafkaError as exc:
                    error = exc
                    failed[place] = pending[place]
            pending = failed
            if pending:
                metrics.SEND_RETRIES.inc()
                failed_rounds += 1
                if isinstance(error, RENEW_ON) or failed_rounds % RENEW_AFTER_ROUNDS == 0:
                    await self._renew()
                log.warning(
                    "Kafka did not acknowledge %d of %d records (%r); sending them again in %.1f s",
                    sum(len(group) for group in pending.values()),
                    len(records),
                    error,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
        return done
