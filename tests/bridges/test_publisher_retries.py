"""The bridges' publisher gets no retried produce errors from a healthy single-replica broker.

Issue 15 saw hundreds of retried `NotEnoughReplicasError` produce responses in the worker's
logs against Kafka 4.4. Those come from transaction verification (KIP-890 part 1): for a
transactional producer on a Produce version older than 12 (aiokafka speaks at most v7), the
broker converts the transaction coordinator's retriable errors (coordinator loading,
concurrent transactions, ...) into NOT_ENOUGH_REPLICAS. The bridges' producer is idempotent
but not transactional, so it must never see one; this keeps it so (a transactional or
otherwise misconfigured publisher would log its retries here).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from support import kafka_io

from benchmarks.webhook import records_on
from connectors.publisher import RawPublisher, raw_headers

pytestmark = pytest.mark.kafka

PARTITIONS = 4
PUBLISHES = 2000
IN_FLIGHT = 32  # the webhook benchmark's connections


async def create_topic(bootstrap: str, topic: str) -> None:
    """Create `topic` and return once each of its partitions took a write: a partition
    created a moment ago may answer its first produce with NotLeaderForPartition while its
    leader loads (a bridge's raw topic exists long before)."""
    await kafka_io.create_topic(bootstrap, topic, PARTITIONS)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for partition in range(PARTITIONS):
            await producer.send_and_wait(topic, b"ready", partition=partition)
    finally:
        await producer.stop()


def test_publishes_log_no_retried_produce_error(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"publisher-retries-{uuid.uuid4().hex[:10]}"
    body = b'{"Records": []}' * 64
    headers = raw_headers("minio", "webhook", {"Content-Type": "application/json"})

    async def scenario() -> list[logging.LogRecord]:
        await create_topic(kafka_bootstrap, topic)
        caplog.clear()
        publisher = RawPublisher(kafka_bootstrap, topic, timeout_s=30.0)
        await publisher.start()
        try:
            left = PUBLISHES

            async def deliver() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await publisher.publish(body, headers)

            await asyncio.gather(*(deliver() for _ in range(IN_FLIGHT)))
            return [
                record
                for record in caplog.records
                if record.name.startswith("aiokafka") and record.levelno >= logging.WARNING
            ]
        finally:
            await publisher.stop()

    with caplog.at_level(logging.WARNING, logger="aiokafka"):
        logged = asyncio.run(scenario())
    assert [record.getMessage() for record in logged] == []
    assert asyncio.run(records_on(kafka_bootstrap, topic)) == PARTITIONS + PUBLISHES
