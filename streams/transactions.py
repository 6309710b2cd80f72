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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from streams import metrics
from streams.records import OutRecord
from streams.sending import (
    MAX_BACKOFF_S,
    PRODUCER_SETTINGS,
    Acknowledged,
    acknowledged,
    enqueue,
    group_by_partition,
)

log = logging.getLogger(__name__)
Result = TypeVar("Result")


class PartitionTransactions:
    """Transactional producers of the emit stage, one per input partition."""

    def __init__(self, bootstrap_servers: str, app_id: str, group_id: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.app_id = app_id
        self.group_id = group_id
        self._producers: dict[int, AIOKafkaProducer] = {}

    async def _producer(self, partition: int) -> AIOKafkaProducer:
        producer = self._producers.get(partition)
        if producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap_servers,
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
        partition now) is raised, since this worker must not go on writing for it.
        """

        async def attempt() -> list[Acknowledged]:
            producer = await self._producer(partition)
            async with producer.transaction():
                groups = await group_by_partition(producer, records)
                queued = [
                    (place, await enqueue(producer, *place, group))
                    for place, group in groups.items()
                ]
                # While the records are in flight: committing waits for them anyway.
                await producer.send_offsets_to_transaction(offsets, self.group_id)
            # Committed, so every record was acknowledged: their offsets are known.
            return [await acknowledged(*place, batches) for place, batches in queued]

        return await self._retrying(partition, "a transaction", attempt)

    async def _retrying(
        self, partition: int, what: str, attempt: Callable[[], Awaitable[Result]]
    ) -> Result:
        """`attempt` until Kafka takes it, with a new producer and a growing pause after each
        failure; a fenced producer is raised."""
        delay = 0.2
        while True:
            try:
                return await attempt()
            except ProducerFenced:
                raise
            except KafkaError as exc:
                metrics.SEND_RETRIES.inc()
                log.warning(
                    "%s for partition %d failed (%r); retrying in %.1f s",
                    what,
                    partition,
                    exc,
                    delay,
                )
                await self._discard(partition)
                await asyncio.sleep(delay)
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
