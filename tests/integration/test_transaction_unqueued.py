"""A record the producer refuses before queueing it (over the client's `message.max.bytes`)
inside an emit transaction: the transaction aborts and names that record (RecordsRefused,
for the caller to replace), and nothing of it is readable, not even the records queued
before it. A transaction never commits with a record of it missing."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from support.kafka_io import create_topic, read_topic

from streams.core.records import OutRecord
from streams.engine.librdkafka.producer import PRODUCER_CONFIG
from streams.engine.librdkafka.transactions import MemberTransactions
from streams.engine.outcomes import RecordsRefused
from streams.progress import Progress

pytestmark = pytest.mark.kafka


def test_a_record_produce_refuses_aborts_the_transaction_and_is_named(
    kafka_bootstrap: str,
) -> None:
    topic = f"unqueued-{uuid.uuid4().hex[:10]}"
    asyncio.run(create_topic(kafka_bootstrap, topic))
    too_large = b"x" * (int(PRODUCER_CONFIG["message.max.bytes"]) + 1)
    small = OutRecord(topic, b"queued first", b"a", ())
    refused = OutRecord(topic, too_large, b"b", ())

    async def commit() -> BaseException | None:
        transactions = MemberTransactions(
            kafka_bootstrap, f"app-{uuid.uuid4().hex[:8]}", "w0", lambda: None, Progress()
        )
        try:
            await transactions.prepare(set())
            await transactions.commit("partition 0", [small, refused], {})
        except RecordsRefused as exc:
            return exc
        finally:
            await transactions.stop()
        return None

    outcome = asyncio.run(commit())
    assert isinstance(outcome, RecordsRefused), outcome
    assert [record for record, _ in outcome.refused] == [refused]
    assert "bytes" in outcome.refused[0][1]  # the reason says what was too large
    assert asyncio.run(read_topic(kafka_bootstrap, topic)) == []  # aborted: nothing readable
