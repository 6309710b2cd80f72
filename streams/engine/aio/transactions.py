"""`processing_guarantee = "exactly_once"`: the emit stage's outputs, its state changelog and
its input offsets commit together, in one Kafka transaction per input partition.

One transactional producer per partition of the repartition topic, with a stable
`transactional.id` (`<app id>-emit-<partition>`): a worker that takes a partition over
fences any older producer of it, and aborts the transaction a killed worker left open. A
batch's records of one partition (output, stale, dead-letter, changelog) and the consumer
offset just past its last input are committed atomically, so after a crash a batch is either
fully visible (and not read again) or not at all (and read again, against a state restored
without it, since the state is restored `read_committed` from the changelog). Consumers of
the output topics must read with `isolation.level=read_committed`.

A record Kafka refuses (streams.engine.aio.producer.REFUSALS: too large for its topic) fails the
whole transaction, which is aborted. The records of a refused batch are then sent one per batch, so
that the next attempt tells which record it is; `commit` raises `RecordsRefused` naming them,
and the caller replaces them (dead letters) and commits again: what commits is still one
transaction with the batch's outputs, changelog and offsets, and nothing is retried forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from streams import metrics
from streams.core.records import OutRecord
from streams.engine import failpoints
from streams.engine.aio.producer import (
    PRODUCER_SETTINGS,
    REFUSALS,
    enqueue,
    group_by_partition,
    settle,
)
from streams.engine.outcomes import MAX_BACKOFF_S, Acknowledged, refusal_reason
from streams.kafka_settings import KafkaSettings
from streams.progress import Progress

log = logging.getLogger(__name__)
Result = TypeVar("Result")


class RecordsRefused(Exception):
    """Kafka refused these records (with the reason each): the transaction was aborted."""

    def __init__(self, refused: list[tuple[OutRecord, str]]) -> None:
        super().__init__(f"Kafka refused {len(refused)} records")
        self.refused = refused


class _Refusal(Exception):  # not a KafkaError: `_retrying` lets it through
    """An attempt failed on refused batches: single records (known), or several together."""

    def __init__(self, records: list[tuple[OutRecord, str]], split: set[tuple[str, int]]) -> None:
        super().__init__("refused")
        self.records = records
        self.split = split


Settled = list[tuple[tuple[str, int], list[OutRecord], tuple[int | None, int, Any, int]]]


def _failures(settled: Settled) -> _Refusal | KafkaError | None:
    """What failed in a transaction's batches: refused records (known one by one, or batches
    of several to send again one record per batch), else the first other error."""
    records: list[tuple[OutRecord, str]] = []
    split: set[tuple[str, int]] = set()
    other: KafkaError | None = None
    for place, group, (_, count, error, failed_count) in settled:
        if error is None:
            continue
        if isinstance(error, REFUSALS):
            if failed_count == 1:
                records.append((group[count], refusal_reason(group[count], error)))
            else:
                split.add(place)
        elif other is None:
            other = error
    if records or split:
        return _Refusal(records, split)
    return other


class PartitionTransactions:
    """Transactional producers of the emit stage, one per input partition."""

    def __init__(
        self, kafka: KafkaSettings | str, app_id: str, group_id: str, progress: Progress
    ) -> None:
        self.kafka = KafkaSettings.of(kafka)
        self.app_id = app_id
        self.group_id = group_id
        self.progress = progress
        self._producers: dict[int, AIOKafkaProducer] = {}

    async def _producer(self, partition: int) -> AIOKafkaProducer:
        producer = self._producers.get(partition)
        if producer is None:
            producer = AIOKafkaProducer(
                **self.kafka.aiokafka_args(),
                client_id=f"{self.app_id}-emit-{partition}",
                transactional_id=f"{self.app_id}-emit-{partition}",
                **PRODUCER_SETTINGS,
            )
            try:
                await producer.start()  # init_transactions: fences and aborts older ones
            except BaseException:
                await producer.stop()
                raise
            self._producers[partition] = producer
        return producer

    async def prepare(self, partitions: set[int]) -> None:
        """Own exactly these partitions: start (and so fence older) producers for them before
        their state is restored, so no earlier owner's transaction is still open then."""
        for partition in set(self._producers) - partitions:
            await self._discard(partition)
        # Together: each start is a few round trips to the transaction coordinator.
        await asyncio.gather(*(self._start(partition) for partition in sorted(partitions)))

    async def _start(self, partition: int) -> None:
        await self._retrying(partition, "starting its producer", lambda: self._producer(partition))

    async def commit(
        self, partition: int, records: Sequence[OutRecord], offsets: dict[TopicPartition, int]
    ) -> list[Acknowledged]:
        """Write `records` and commit `offsets` for the group in one transaction; where the
        records of each topic partition went.

        Retries while Kafka is unavailable; a fenced producer (another worker owns the
        partition now) is raised, since this worker must not go on writing for it; records
        Kafka refuses are raised as RecordsRefused, once the attempt that tells which they
        are was aborted.
        """
        split: set[tuple[str, int]] = set()

        async def attempt() -> list[Acknowledged]:
            producer = await self._producer(partition)
            async with producer.transaction():
                groups = await group_by_partition(producer, records)
                failpoints.check_writable(topic for topic, _ in groups)
                queued = [
                    (place, group, await enqueue(producer, *place, group, place in split))
                    for place, group in groups.items()
                ]
                # While the records are in flight: they are acknowledged meanwhile.
                await producer.send_offsets_to_transaction(offsets, self.group_id)
                # Every batch must have succeeded before the commit: aiokafka commits a
                # transaction whose batch failed (without it), so a failure is raised here,
                # inside the block, which aborts the transaction.
                settled: Settled = [
                    (place, group, await settle(batches)) for place, group, batches in queued
                ]
                failure = _failures(settled)
                if failure is not None:
                    raise failure
            return [
                Acknowledged(*place, first if first is not None else -1, count)
                for place, _, (first, count, _, _) in settled
            ]

        while True:
            try:
                return await self._retrying(partition, "a transaction", attempt)
            except _Refusal as refusal:
                # Aborted; the refused batch left a gap in the producer's sequence numbers.
                await self._discard(partition)
                if refusal.records:
                    raise RecordsRefused(refusal.records) from None
                split |= refusal.split  # again, one record per batch where several were refused

    async def _retrying(
        self, partition: int, what: str, attempt: Callable[[], Awaitable[Result]]
    ) -> Result:
        """`attempt` until Kafka takes it, with a new producer and a growing pause after each
        failure; a fenced producer is raised."""
        try:
            return await self._attempts(partition, what, attempt)
        finally:
            self.progress.given_up("emit", partition)  # fenced, stopping: no trouble left

    async def _attempts(
        self, partition: int, what: str, attempt: Callable[[], Awaitable[Result]]
    ) -> Result:
        delay = 0.2
        while True:
            self.progress.check()
            try:
                result = await self.progress.watch(
                    "emit", f"{what} for partition {partition}", attempt(), partition
                )
                self.progress.recovered("emit", partition)
                return result
            except ProducerFenced:
                raise
            except KafkaError as exc:
                metrics.SEND_RETRIES.inc()
                self.progress.trouble(
                    "emit",
                    f"{type(exc).__name__}:{partition}",
                    f"{what} for partition {partition} failed ({exc!r}); retrying",
                    partition,
                )
                await self._discard(partition)
                await self.progress.pause(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)

    async def _discard(self, partition: int) -> None:
        producer = self._producers.pop(partition, None)
        if producer is not None:
            try:
                await producer.stop()
            except KafkaError:
                log.debug("stopping the producer of partition %d failed", partition)

    async def stop(self) -> None:
        for partition in list(self._producers):
            await self._discard(partition)


def offsets_after(topic: str, partition: int, last_offset: int) -> dict[TopicPartition, int]:
    return {TopicPartition(topic, partition): last_offset + 1}
