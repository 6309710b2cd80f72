"""The consumer as a newcomer meets it (issue 24, item 2): a dedupe store that does not answer
stops `run()` at start with one line, and a failing handler's traceback is logged once, then
one line per retry."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

import pytest
import redis.asyncio as redis
from consumer_support import create_topics, event, produce_events, run_until, unique
from support.worker import free_port

from fileevents import (
    DedupeStoreUnavailable,
    FileEvent,
    FileEvents,
    MemoryDedupeStore,
    Outcome,
    RedisDedupeStore,
    RetryPolicy,
)


def test_a_dedupe_store_that_does_not_answer_stops_run_at_once_with_one_line() -> None:
    port = free_port()  # nothing listens there: the Redis server of the README's first try
    handled: list[str] = []

    async def scenario() -> DedupeStoreUnavailable:
        client = redis.Redis(host="127.0.0.1", port=port)
        events = FileEvents(
            bootstrap_servers="127.0.0.1:9",  # never reached: the store is checked first
            topic=unique("events"),
            group_id=unique("group"),
            dedupe=RedisDedupeStore(client),
            handle_signals=False,
        )

        @events.on("*")
        async def record(item: FileEvent) -> None:
            handled.append(item.id)

        try:
            with pytest.raises(DedupeStoreUnavailable) as raised:
                await asyncio.wait_for(events.run(), 30)
            return raised.value
        finally:
            await client.aclose()

    began = time.monotonic()
    error = asyncio.run(scenario())
    assert time.monotonic() - began < 15
    message = str(error)
    assert "\n" not in message
    assert f"RedisDedupeStore at 127.0.0.1:{port}" in message and "does not answer" in message
    assert "MemoryDedupeStore()" in message  # what to use locally instead
    assert handled == []


@pytest.mark.kafka
def test_a_failing_handler_logs_its_traceback_once_then_one_line_per_retry(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = unique("events"), unique("group")
    poison = event("inbox/poison.pdf", 1)
    events = FileEvents(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        group_id=group,
        dedupe=MemoryDedupeStore(),
        retry=RetryPolicy(attempts=4, initial_backoff=timedelta(milliseconds=10)),
        commit_interval=timedelta(milliseconds=50),
        handle_signals=False,
    )

    @events.on("created")
    async def convert(item: FileEvent) -> None:
        raise RuntimeError("cannot convert this one")

    async def scenario() -> None:
        await create_topics(kafka_bootstrap, (topic, 1), (events.dead_letter_topic, 1))
        await produce_events(kafka_bootstrap, topic, [poison])
        await run_until(
            events, lambda: events.outcomes.get(Outcome.DEAD_LETTERED.value), "the dead letter"
        )

    with caplog.at_level(logging.INFO, logger="fileevents"):
        asyncio.run(scenario())
    failed = [record for record in caplog.records if poison.id in record.getMessage()]
    assert [record.getMessage().split(", attempt ")[1][0] for record in failed] == list("1234")
    assert [record.exc_info is not None for record in failed] == [True, False, False, False]
    checked = [
        r for r in caplog.records if "dedupe store MemoryDedupeStore answers" in r.getMessage()
    ]
    assert len(checked) == 1
