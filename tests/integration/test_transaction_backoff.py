"""Back-to-back emit transactions on one partition (issue 32 item 9): the transactional
producer retries the coordinator's CONCURRENT_TRANSACTIONS (the previous transaction's markers
still being written) after `retry.backoff.ms`, which MemberTransactions sets to
RETRY_BACKOFF_MS instead of librdkafka's 100 ms. What must not change: each transaction's
records readable once (read_committed), its offsets committed with it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from aiokafka import TopicPartition
from confluent_kafka import Consumer, Producer
from support.kafka_io import committed, create_topic, read_topic

from streams.core.records import OutRecord
from streams.engine.librdkafka.transactions import RETRY_BACKOFF_MS, MemberTransactions
from streams.progress import Progress

pytestmark = pytest.mark.kafka

TRANSACTIONS = 30


async def back_to_back(bootstrap: str, configs: list[dict[str, Any]]) -> tuple[str, str, str, int]:
    """TRANSACTIONS transactions, each started as soon as the one before committed, each with
    one output record and one changelog record and the next input offset; their topics and
    group, and the transactions the member counted (TransactionPhases)."""
    tag = uuid.uuid4().hex[:10]
    output, changelog, source, group = f"out-{tag}", f"log-{tag}", f"in-{tag}", f"emit-{tag}"
    for topic in (output, changelog, source):
        await create_topic(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})

    def factory(config: dict[str, Any]) -> Producer:
        configs.append(config)
        return Producer(config)

    member = MemberTransactions(
        bootstrap,
        f"app-{tag}",
        "w0",
        consumer.consumer_group_metadata,
        Progress(),
        producer_factory=factory,
        group_id=group,
    )
    try:
        await member.prepare(set())
        for index in range(TRANSACTIONS):
            records = [
                OutRecord(output, b"k", f"event {index}".encode()),
                OutRecord(changelog, b"k", f"state {index}".encode(), (), 0),
            ]
            await asyncio.wait_for(
                member.commit(0, records, {TopicPartition(source, 0): index + 1}), 60
            )
    finally:
        await member.stop()
        consumer.close()
    return output, changelog, group, member.phases.committed


def test_back_to_back_transactions_commit_each_once_with_the_short_backoff(
    kafka_bootstrap: str,
) -> None:
    configs: list[dict[str, Any]] = []

    async def scenario() -> None:
        output, changelog, group, counted = await back_to_back(kafka_bootstrap, configs)
        assert counted == TRANSACTIONS  # each timed by phase (TransactionPhases)
        events = [read.value for read in await read_topic(kafka_bootstrap, output)]
        assert events == [f"event {index}".encode() for index in range(TRANSACTIONS)]
        states = [read.value for read in await read_topic(kafka_bootstrap, changelog)]
        assert states == [f"state {index}".encode() for index in range(TRANSACTIONS)]
        source = output.replace("out-", "in-", 1)
        assert (await committed(kafka_bootstrap, group, source)).get(0) == TRANSACTIONS

    asyncio.run(scenario())
    assert len(configs) == 1, "one producer: no transaction was aborted and retried"
    assert configs[0]["retry.backoff.ms"] == RETRY_BACKOFF_MS
    assert configs[0]["enable.idempotence"] is True  # what makes a faster produce retry safe
