"""The engine's sender against a broker, stage one's (`failures_only`: Kafka reports only the
records it did not take) and the emit stage's: two writes in flight at once each end once
Kafka holds their records; a record the topic refuses, in one message set with records of
both writes, is told apart and dead-lettered alone (before 2026-12-05 a record of the other
write refused beside it was taken for a culprit); every other record is stored once."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from support.kafka_io import create_topic, read_topic

from streams.core.records import OutRecord
from streams.engine.librdkafka.producer import RdRecordSender
from streams.engine.outcomes import DeadLetters, Sent
from streams.progress import Progress

pytestmark = pytest.mark.kafka

TOPIC_MAX_BYTES = 20_000


@pytest.mark.parametrize("failures_only", [True, False], ids=["stage-one", "every-report"])
def test_concurrent_writes_store_everything_and_dead_letter_only_the_refused(
    kafka_bootstrap: str, failures_only: bool
) -> None:
    suffix = uuid.uuid4().hex[:10]
    topic, dead_letters = f"quiet-{suffix}", f"quiet-dlq-{suffix}"
    asyncio.run(
        create_topic(kafka_bootstrap, topic, 2, {"max.message.bytes": str(TOPIC_MAX_BYTES)})
    )
    asyncio.run(create_topic(kafka_bootstrap, dead_letters))
    first = [OutRecord(topic, f"a{n}".encode(), f"k{n % 7}".encode(), ()) for n in range(300)]
    too_large = OutRecord(topic, b"x" * (TOPIC_MAX_BYTES + 1000), b"k3", ())
    first.insert(150, too_large)
    second = [OutRecord(topic, f"b{n}".encode(), f"k{n % 7}".encode(), ()) for n in range(300)]

    async def send() -> tuple[Sent, Sent]:
        sender = RdRecordSender(
            kafka_bootstrap,
            f"quiet-{suffix}",
            Progress(),
            DeadLetters(dead_letters, "normalize"),
            failures_only=failures_only,
        )
        await sender.start()
        try:
            sent = await asyncio.wait_for(
                asyncio.gather(
                    sender.send_all(first, "normalize"), sender.send_all(second, "normalize")
                ),
                60,
            )
            return sent[0], sent[1]
        finally:
            await sender.stop()

    sent_first, sent_second = asyncio.run(send())
    assert [refused.record for refused in sent_first.refused] == [too_large]
    assert sent_second.refused == []
    if failures_only:  # no offsets
        assert sent_first.acknowledged == [] and sent_second.acknowledged == []
    else:
        assert sum(ack.count for ack in sent_second.acknowledged) == len(second)

    stored = [read.value for read in asyncio.run(read_topic(kafka_bootstrap, topic))]
    expected = [record.value for record in first + second if record is not too_large]
    assert sorted(stored) == sorted(expected)  # every one once: nothing lost, none twice
    letters = asyncio.run(read_topic(kafka_bootstrap, dead_letters))
    assert len(letters) == 1
    assert letters[0].headers["error.topic"] == topic.encode()
    assert letters[0].value == too_large.value
