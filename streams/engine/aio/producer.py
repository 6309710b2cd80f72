"""Produce a batch of records and wait until Kafka acknowledged every one of them.

Records are grouped per topic partition and handed to the producer as whole record batches
(`create_batch`/`send_batch`): one future and one accumulator entry per partition instead of
per record, which is most of what a per-record `send` costs in Python. Partitions are chosen
exactly as the producer would (murmur2 of the key, Java-compatible), so keys land where any
Kafka client expects them.

An idempotent producer with acks=all. When Kafka does not acknowledge (broker down, leader
moving), the partitions not acknowledged are sent again, in their order, with a growing
pause, until they are: a transient failure holds the stream back, it never becomes a drop.

A record Kafka refuses for what it is (`REFUSALS`: too large for its topic, e.g. a topic
created beforehand with a smaller `max.message.bytes`) is never sent again: the records of
the refused batch are sent one per batch to find it, and it is replaced by what the caller's
`Replace` makes of it (a dead letter with the broker's reason), or by `DeadLetters`' default.
A dead letter refused in turn is sent once more without its value; refused again, it is
dropped with an error in the log. Every retry loop ends with `Stopping` once the worker stops
(streams.progress), and every wait longer than a few seconds is reported there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)
from aiokafka.structs import RecordMetadata

from streams import metrics
from streams.core.partitioning import partition_for
from streams.core.records import OutRecord
from streams.engine import failpoints
from streams.engine.aio.producer_errors import RENEW_ON
from streams.engine.outcomes import (
    MAX_BACKOFF_S,
    MAX_BATCH_BYTES,
    Acknowledged,
    DeadLetters,
    Refused,
    Replace,
    Sender,
    Sent,
    refusal_reason,
)
from streams.engine.topics import DEAD_LETTER_MAX_MESSAGE_BYTES
from streams.kafka_settings import KafkaSettings
from streams.progress import Progress

log = logging.getLogger(__name__)

RENEW_AFTER_ROUNDS = 5
PRODUCER_SETTINGS = {
    "acks": "all",
    "enable_idempotence": True,
    "linger_ms": 5,
    "max_batch_size": MAX_BATCH_BYTES,
    "max_request_size": DEAD_LETTER_MAX_MESSAGE_BYTES,  # dead letters carry whole deliveries
    "request_timeout_ms": 30_000,
}


REFUSALS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
)
"""Errors Kafka answers for the records themselves: sending them again cannot succeed."""


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
    producer: AIOKafkaProducer,
    topic: str,
    partition: int,
    records: Sequence[OutRecord],
    single: bool = False,
) -> list[tuple[int, asyncio.Future[RecordMetadata]]]:
    """Queue `records` (all for one partition) as record batches; (count, future) per batch;
    `single`: one record per batch (to tell which record Kafka refuses).

    Must be awaited inside the transaction for a transactional producer."""
    queued: list[tuple[int, asyncio.Future[RecordMetadata]]] = []
    batch = producer.create_batch()
    count = 0
    for record in records:
        headers = list(record.headers)
        if (not single or not count) and batch.append(
            key=record.key, value=record.value, timestamp=None, headers=headers
        ):
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


async def settle(
    queued: list[tuple[int, asyncio.Future[RecordMetadata]]],
) -> tuple[int | None, int, BaseException | None, int]:
    """Wait for every batch of one partition: (first offset, records acknowledged before the
    first failed batch, that batch's error, its record count). Every future is awaited, so
    none leaves an unretrieved exception behind."""
    first: int | None = None
    count = 0
    error: BaseException | None = None
    failed_count = 0
    for size, future in queued:
        try:
            metadata = await future
        except KafkaError as exc:
            if error is None:
                error, failed_count = exc, size
            continue
        if error is None:
            if first is None:
                first = metadata.offset
            count += size
    return first, count, error, failed_count


@dataclass(slots=True)
class _Pending:
    """One partition's records not acknowledged yet, in order."""

    records: list[OutRecord]
    single: bool = False
    """Send one record per batch: a batch of several was refused."""


class RecordSender(Sender):
    """The stream's producer for output, stale, dead-letter, repartition and changelog records."""

    def __init__(
        self,
        kafka: KafkaSettings | str,
        client_id: str,
        progress: Progress,
        dead_letters: DeadLetters,
    ) -> None:
        super().__init__(kafka, client_id, progress, dead_letters)
        self._producer = self._new_producer()

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **self.kafka.aiokafka_args(), client_id=self.client_id, **PRODUCER_SETTINGS
        )

    async def start(self) -> None:
        delay = 0.5
        while True:
            try:
                await self._producer.start()
                return
            except KafkaError as exc:
                log.warning("producer cannot reach Kafka (%r); retrying in %.1f s", exc, delay)
                await self.progress.pause(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)

    async def stop(self) -> None:
        await self._producer.stop()

    async def _renew(self) -> None:
        """Replace a producer whose idempotence state the broker no longer accepts (after a
        broker restart aiokafka can fail every later send with OutOfOrderSequenceNumber, and
        after a refused batch it always does: its sequence number is missing)."""
        log.info("renewing the producer %s", self.client_id)
        try:
            await self._producer.stop()
        except KafkaError:
            log.debug("stopping the old producer failed", exc_info=True)
        self._producer = self._new_producer()
        await self.start()

    async def _send(
        self, records: Sequence[OutRecord], stage: str, replace: Replace | None, who: object
    ) -> Sent:
        sent = Sent()
        unplaced: list[OutRecord] = list(records)
        pending: dict[tuple[str, int], _Pending] = {}
        delay = 0.2
        failed_rounds = 0
        while unplaced or pending:
            self.progress.check()
            error: BaseException | None = None
            if unplaced:
                try:
                    # Needs each topic's partition count: metadata, i.e. a reachable broker.
                    groups = await group_by_partition(self._producer, unplaced)
                except KafkaError as exc:
                    self.progress.trouble(
                        stage, "metadata", f"no metadata for the records' topics ({exc!r})", who
                    )
                    metrics.SEND_RETRIES.inc()
                    await self.progress.pause(delay)
                    delay = min(delay * 2, MAX_BACKOFF_S)
                    continue
                for place, group in groups.items():
                    pending.setdefault(place, _Pending([])).records.extend(group)
                unplaced = []
            queued: dict[tuple[str, int], list[tuple[int, asyncio.Future[RecordMetadata]]]] = {}
            for place, waiting in pending.items():
                try:
                    failpoints.check_writable((place[0],))
                    queued[place] = await enqueue(
                        self._producer, *place, waiting.records, waiting.single
                    )
                except KafkaError as exc:
                    error = exc
                    break
            refusals = False
            for place, batches in queued.items():
                waiting = pending[place]
                first, count, failure, failed_count = await self.progress.watch(
                    stage, f"{place[0]}[{place[1]}]", settle(batches), who
                )
                if count:
                    assert first is not None
                    sent.acknowledged.append(Acknowledged(*place, first, count))
                    del waiting.records[:count]
                if failure is None:
                    continue
                if not isinstance(failure, REFUSALS):
                    error = failure
                    continue
                refusals = True
                if failed_count > 1:
                    waiting.single = True  # find which of them Kafka refuses
                    continue
                record = waiting.records.pop(0)
                refused = self._refused(record, failure, replace)
                sent.refused.append(refused)
                if refused.replacement is not None:
                    unplaced.append(refused.replacement)
            for place in [place for place, waiting in pending.items() if not waiting.records]:
                del pending[place]
            if refusals:
                # The refused batch left a gap in the producer's sequence numbers: the later
                # batches of its partition failed for that, so send again at once.
                await self._renew()
                continue
            if error is None:
                continue
            metrics.SEND_RETRIES.inc()
            failed_rounds += 1
            self.progress.trouble(
                stage,
                type(error).__name__,
                f"Kafka did not acknowledge "
                f"{sum(len(waiting.records) for waiting in pending.values())} of "
                f"{len(records)} records ({error!r}); sending them again",
                who,
            )
            if (
                isinstance(error, RENEW_ON)
                or not getattr(error, "retriable", False)  # its batch left a sequence gap
                or failed_rounds % RENEW_AFTER_ROUNDS == 0
            ):
                await self._renew()
            await self.progress.pause(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
        self.progress.recovered(stage, who)
        return sent

    def _refused(self, record: OutRecord, exc: BaseException, replace: Replace | None) -> Refused:
        reason = refusal_reason(record, exc)
        if replace is None or record.topic == self.dead_letters.topic:
            replace = self.dead_letters
        replacement = replace(record, reason)
        outcome = "dead-lettered" if replacement is not None else "dropped"
        metrics.REFUSED.labels(record.topic, outcome).inc()
        log.error("%s; %s", reason, outcome)
        return Refused(record, reason, replacement)
