"""A consumer of a topic that does not exist says so, naming it, at most every few seconds,
without creating it, and consumes once the stream created it (issue 16, item 5)."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from consumer_support import create_topics, event, eventually, produce_events, unique

from fileevents import FileEvent, FileEvents
from fileevents.app import MISSING_TOPIC_EVERY_S

pytestmark = pytest.mark.kafka


async def topic_exists(bootstrap: str, topic: str) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return topic in await admin.list_topics()
    finally:
        await admin.close()


def test_a_missing_topic_is_named_until_it_exists(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = unique("events"), unique("group")
    seen: list[str] = []
    events = FileEvents(
        bootstrap_servers=kafka_bootstrap, topic=topic, group_id=group, handle_signals=False
    )

    @events.on("*")
    async def handle(item: FileEvent) -> None:
        seen.append(item.id)

    def missing_lines() -> list[logging.LogRecord]:
        return [
            record
            for record in caplog.records
            if record.name == "fileevents" and "does not exist" in record.getMessage()
        ]

    async def scenario() -> None:
        task = asyncio.create_task(events.run())
        try:
            await eventually(lambda: len(missing_lines()) >= 2, 30, "two missing-topic lines")
            (first, second) = missing_lines()[:2]
            assert topic in first.getMessage()
            assert first.levelno == logging.WARNING
            assert second.created - first.created >= MISSING_TOPIC_EVERY_S - 0.5
            # Waiting for it did not create it (a broker with auto.create.topics.enable would).
            assert not await topic_exists(kafka_bootstrap, topic)
            await create_topics(kafka_bootstrap, (topic, 1))
            await produce_events(kafka_bootstrap, topic, [event("a.jpg", 1)])
            await eventually(lambda: task.done() or seen, 60, "the event after the topic appeared")
            assert seen == ["s3:a.jpg:1"]
        finally:
            events.stop()
            await asyncio.wait_for(task, 30)

    with caplog.at_level(logging.INFO, logger="fileevents"):
        asyncio.run(scenario())
    lines = missing_lines()
    assert all(topic in line.getMessage() for line in lines)
    spacing = [later.created - earlier.created for earlier, later in itertools.pairwise(lines)]
    assert all(gap >= MISSING_TOPIC_EVERY_S - 0.5 for gap in spacing), spacing
