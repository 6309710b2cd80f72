"""A partition at `max_buffered` is held, not paused in aiokafka: no more of it is handed out,
the records aiokafka fetched for it stay in its buffer (pausing dropped them, and they were
fetched again after the resume), and the member still polls while every partition is held."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from aiokafka import TopicPartition
from consumer_support import create_topics, event, eventually, produce_events, unique

from fileevents import FileEvent, FileEvents, Outcome

pytestmark = pytest.mark.kafka


def held_consumer(bootstrap: str, topic: str, group: str, **more: object) -> FileEvents:
    return FileEvents(
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=group,
        commit_interval=timedelta(milliseconds=50),
        max_buffered=50,
        max_concurrency=8,
        handle_signals=False,
        **more,  # type: ignore[arg-type]
    )


def test_a_held_partition_hands_out_no_more_and_keeps_its_fetched_records(
    kafka_bootstrap: str,
) -> None:
    topic, group = unique("events"), unique("group")
    items = [event(f"k{key:03d}.bin", seq) for seq in range(1, 6) for key in range(300)]
    gate = asyncio.Event()
    runs: Counter[str] = Counter()
    order: dict[str, list[int]] = defaultdict(list)
    events = held_consumer(kafka_bootstrap, topic, group)

    @events.on("*")
    async def handle(item: FileEvent) -> None:
        await gate.wait()
        runs[item.id] += 1
        order[item.key].append(int(item.sequencer or "-1"))

    tp = TopicPartition(topic, 0)

    async def scenario() -> tuple[int, int, set[TopicPartition]]:
        await create_topics(kafka_bootstrap, (topic, 1))
        await produce_events(kafka_bootstrap, topic, items)
        task = asyncio.create_task(events.run())
        try:
            await eventually(
                lambda: task.done() or (tp in events._partitions and events._partitions[tp].paused),
                30,
                "the partition held",
            )
            backlog = events._partitions[tp].backlog
            await asyncio.sleep(0.5)  # fetch-loop turns, every handler still waiting
            later = events._partitions[tp].backlog
            assert events._consumer is not None
            paused = set(events._consumer.paused())
            gate.set()
            await eventually(lambda: task.done() or events.outcomes.total() == 1500, 60, "all")
        finally:
            events.stop()
            await asyncio.wait_for(task, 30)
        return backlog, later, paused

    backlog, later, paused = asyncio.run(scenario())
    assert 50 <= backlog <= 500, "more than one fetch's records handed out past the bound"
    assert later == backlog, "records were handed out while the partition was held"
    assert not paused, "paused in aiokafka (its fetched records dropped)"
    assert events.outcomes == {Outcome.HANDLED.value: 1500}
    assert runs == {item.id: 1 for item in items}
    assert all(seqs == [1, 2, 3, 4, 5] for seqs in order.values())


@pytest.mark.slow
def test_a_member_whose_every_partition_is_held_still_polls_and_stays_in_its_group(
    kafka_bootstrap: str,
) -> None:
    topic, group = unique("events"), unique("group")
    items = [event(f"k{key:03d}.bin", 1) for key in range(200)]
    gate = asyncio.Event()
    runs: Counter[str] = Counter()
    events = held_consumer(
        kafka_bootstrap, topic, group, consumer_config={"max_poll_interval_ms": 12_000}
    )
    assignments: list[set[TopicPartition]] = []
    assigned = events._assigned

    async def counting(partitions: set[TopicPartition]) -> None:
        assignments.append(set(partitions))
        await assigned(partitions)

    events._assigned = counting  # type: ignore[method-assign]

    @events.on("*")
    async def handle(item: FileEvent) -> None:
        await gate.wait()
        runs[item.id] += 1

    async def scenario() -> None:
        await create_topics(kafka_bootstrap, (topic, 1))
        await produce_events(kafka_bootstrap, topic, items)
        task = asyncio.create_task(events.run())
        try:
            tp = TopicPartition(topic, 0)
            await eventually(
                lambda: task.done() or (tp in events._partitions and events._partitions[tp].paused),
                30,
                "the partition held",
            )
            await asyncio.sleep(25)  # twice max_poll_interval_ms, every partition held
            gate.set()
            await eventually(lambda: task.done() or events.outcomes.total() == 200, 30, "all")
        finally:
            events.stop()
            await asyncio.wait_for(task, 30)

    asyncio.run(scenario())
    assert len(assignments) == 1, f"the member left its group and rejoined: {assignments}"
    assert runs == {item.id: 1 for item in items}
