"""Produce a batch of records and wait until Kafka acknowledged every one of them.

An idempotent producer with acks=all. When Kafka does not acknowledge (broker down, leader
moving), the records not acknowledged are sent again, in their order, with a growing pause,
until they are: a transient failure holds the stream back, it never becomes a drop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata

from streams import metrics
from streams.producer_errors import RENEW_ON
from streams.records import OutRecord
from streams.topics import RAW_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0
RENEW_AFTER_ROUNDS = 5


class RecordSender:
    """The stream's one producer for output, stale, dead-letter and changelog records."""

    def __init__(self, bootstrap_servers: str, client_id: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.client_id = client_id
        self._producer = self._new_producer()

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap_servers,
            client_id=self.client_id,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            max_batch_size=256 * 1024,
            max_request_size=RAW_MAX_MESSAGE_BYTES,  # dead letters carry whole deliveries
            request_timeout_ms=30_000,
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

    async def send_all(self, records: Sequence[OutRecord]) -> list[RecordMetadata]:
        """Send every record; return their metadata, in order, once all are acknowledged."""
        results: list[RecordMetadata | None] = [None] * len(records)
        pending = list(range(len(records)))
        delay = 0.2
        failed_rounds = 0
        while pending:
            futures: list[tuple[int, asyncio.Future[RecordMetadata]]] = []
            failed: list[int] = []
            error: BaseException | None = None
            for position, index in enumerate(pending):
                record = records[index]
                try:
                    futures.append(
                        (
                            index,
                            await self._producer.send(
                                record.topic,
                                record.value,
                                key=record.key,
                                partition=record.partition,
                                headers=list(record.headers) or None,
                            ),
                        )
                    )
                except KafkaError as exc:
                    error = exc
                    failed.extend(pending[position:])
                    break
            for index, future in futures:
                try:
                    results[index] = await future
                except KafkaError as exc:
                    error = exc
                    failed.append(index)
            pending = sorted(failed)
            if pending:
                metrics.SEND_RETRIES.inc()
                failed_rounds += 1
                if isinstance(error, RENEW_ON) or failed_rounds % RENEW_AFTER_ROUNDS == 0:
                    await self._renew()
                log.warning(
                    "Kafka did not acknowledge %d of %d records (%r); sending them again in %.1f s",
                    len(pending),
                    len(records),
                    error,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
        return [result for result in results if result is not None]
