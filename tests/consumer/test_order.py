"""Per-key order under load: 2,000 events over 50 keys and 4 partitions, two consumers of
one group (the second joins mid-stream, so partitions move), handlers awaiting at random."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from consumer_support import create_topics, event, eventually, produce_events, unique

from fileevents import EventContext, FileEvent, FileEvents, Outcome

pytestmark = pytest.mark.kafka

KEYS = [f"tenant/{index:02d}/photo.jpg" for index in range(50)]
PER_KEY = 40  # 2,000 events: half before the second consumer joins, half after


def test_per_key_order_with_concurrent_partitions_and_a_rebalance(kafka_bootstrap: str) -> None:
    topic, group = unique("events"), unique("group")
    rng = random.Random(6)
    seen: dict[str, list[int]] = defaultdict(list)
    running: dict[str, str] = {}  # key -> consumer handling one of its events
    violations: list[str] = []
    handled_by: Counter[str] = Counter()
    most_at_once = [0]

    def consumer(name: str) -> FileEvents:
        events = FileEvents(
            bootstrap_servers=kafka_bootstrap,
            topic=topic,
            group_id=group,
            commit_interval=timedelta(milliseconds=100),
            max_buffered=100,  # exercise pausing and resuming fetches too
            handle_signals=False,
            consumer_config={"heartbeat_interval_ms": 200, "session_timeout_ms": 6000},
        )

        @events.on("*")
        async def handle(item: FileEvent, context: EventContext) -> None:
            if item.key in running:
                violations.append(f"{item.id} on {name} while {running[item.key]} ran")
            running[item.key] = name
            most_at_once[0] = max(most_at_once[0], len(running))
            await asyncio.sleep(rng.random() * 0.002)
            del running[item.key]
            seen[item.key].append(int(item.sequencer or "-1"))
            handled_by[name] += 1

        return events

    def wave(first_seq: int) -> list[FileEvent]:
        return [
            event(key, seq) for seq in range(first_seq, first_seq + PER_KEY // 2) for key in KEYS
        ]

    def total() -> int:
        return sum(handled_by.values())

    async def scenario() -> tuple[FileEvents, FileEvents]:
        await create_topics(kafka_bootstrap, (topic, 4))
        await produce_events(kafka_bootstrap, topic, wave(0))
        one, two = consumer("one"), consumer("two")
        tasks = [asyncio.create_task(one.run())]
        try:
            await eventually(lambda: total() >= 200, 30, "the first consumer to get going")
            tasks.append(asyncio.create_task(two.run()))
            await eventually(lambda: two.assignment, 30, "the second consumer's partitions")
            await eventually(
                lambda: len(one.assignment) + len(two.assignment) == 4, 30, "a settled group"
            )
            await produce_events(kafka_bootstrap, topic, wave(PER_KEY // 2))
            await eventually(lambda: total() >= len(KEYS) * PER_KEY, 60, "every event")
        finally:
            one.stop()
            two.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return one, two

    one, two = asyncio.run(scenario())

    assert violations == []
    assert {key: seen[key] for key in KEYS} == {key: list(range(PER_KEY)) for key in KEYS}
    assert most_at_once[0] > 1, "partitions were never handled concurrently"
    assert handled_by["one"] > 0 and handled_by["two"] > 0
    handled = one.outcomes[Outcome.HANDLED.value] + two.outcomes[Outcome.HANDLED.value]
    assert handled == len(KEYS) * PER_KEY
