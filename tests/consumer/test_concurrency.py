"""Per-key concurrency (issue 34, item 1): events of different keys run at once, up to
`max_concurrency`, never two of one key; a failing event holds back its own key and the
commit point only; the events done above the commit point are in the commit's metadata, and
a restart skips them."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from consumer_support import committed, create_topics, event, eventually, produce_events, unique

from fileevents import FileEvent, FileEvents, MemoryDedupeStore, Outcome, RetryPolicy
from fileevents.partition import decode_finished, encode_finished


def test_finished_offsets_round_trip_through_commit_metadata() -> None:
    assert decode_finished(10, encode_finished(10, [11, 12, 15, 40])) == {11, 12, 15, 40}
    assert encode_finished(10, []) == ""
    assert decode_finished(10, "") == set()
    assert decode_finished(10, "someone else's metadata") == set()
    assert decode_finished(10, "fileevents:1:not base64!") == set()
    # Far above the commit point: not recorded (run again after a restart), never wrong.
    far = encode_finished(0, [1, 10**6])
    assert decode_finished(0, far) == {1}
    assert len(encode_finished(0, range(1, 24_001))) < 4096


def test_a_bare_decorator_raises_naming_the_fix() -> None:
    events = FileEvents(bootstrap_servers="127.0.0.1:9", topic="t", group_id="g")

    async def handle(item: FileEvent) -> None: ...

    with pytest.raises(TypeError, match=r'@events.on needs parentheses: write @events.on\("\*"\)'):
        events.on(handle)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_concurrency"):
        FileEvents(bootstrap_servers="127.0.0.1:9", topic="t", group_id="g", max_concurrency=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_concurrency"):
        FileEvents(bootstrap_servers="127.0.0.1:9", topic="t", group_id="g", max_concurrency=0)


def test_handlers_in_functions_are_named_without_locals() -> None:
    events = FileEvents(bootstrap_servers="127.0.0.1:9", topic="t", group_id="g")

    @events.on("*")
    async def handle(item: FileEvent) -> None: ...

    assert events._registry.names() == [
        f"{__name__}.test_handlers_in_functions_are_named_without_locals.handle"
    ]


@pytest.mark.kafka
def test_keys_run_concurrently_up_to_max_concurrency_one_event_per_key(
    kafka_bootstrap: str,
) -> None:
    topic, group = unique("events"), unique("group")
    keys = [f"photos/{index:02d}.jpg" for index in range(20)]
    items = [event(key, seq) for seq in range(3) for key in keys]  # one partition
    running: set[str] = set()
    most = [0]
    violations: list[str] = []
    seen: dict[str, list[int]] = defaultdict(list)
    events = FileEvents(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        group_id=group,
        max_concurrency=8,
        commit_interval=timedelta(milliseconds=50),
        handle_signals=False,
    )

    @events.on("*")
    async def handle(item: FileEvent) -> None:
        if item.key in running:
            violations.append(item.id)
        running.add(item.key)
        most[0] = max(most[0], len(running))
        await asyncio.sleep(0.05)
        running.discard(item.key)
        seen[item.key].append(int(item.sequencer or "-1"))

    async def scenario() -> dict[int, int]:
        await create_topics(kafka_bootstrap, (topic, 1))
        await produce_events(kafka_bootstrap, topic, items)
        task = asyncio.create_task(events.run())
        try:
            await eventually(lambda: sum(map(len, seen.values())) == len(items), 30, "every event")
            await eventually(
                lambda: events.outcomes[Outcome.HANDLED.value] == len(items), 5, "the outcomes"
            )
        finally:
            events.stop()
            await asyncio.wait_for(task, 30)
        offsets: dict[int, int] = await committed(kafka_bootstrap, group, topic)
        return offsets

    offsets = asyncio.run(scenario())
    assert violations == []
    assert most[0] == 8
    assert dict(seen) == {key: [0, 1, 2] for key in keys}
    assert offsets == {0: len(items)}


async def committed_with_metadata(
    bootstrap: str, group: str, topic: str
) -> dict[int, tuple[int, str]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: (m.offset, m.metadata) for tp, m in offsets.items() if tp.topic == topic}


@pytest.mark.kafka
def test_a_failing_event_holds_back_its_key_and_the_commit_point_only(
    kafka_bootstrap: str,
) -> None:
    """On one partition: `a` fails twice (a second of backoff), `a`'s next event waits for
    it, `b`'s five events do not; meanwhile the commit stays at `a`'s first event, with
    `b`'s recorded as done above it; then everything is committed."""
    topic, group = unique("events"), unique("group")
    first_a = event("a.txt", 0)
    later_a = event("a.txt", 1)
    bs = [event("b.txt", seq) for seq in range(2, 7)]
    log: list[tuple[str, str]] = []
    failures_left = [2]
    during: list[tuple[int, str]] = []
    events = FileEvents(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        group_id=group,
        retry=RetryPolicy(attempts=3, initial_backoff=timedelta(milliseconds=600)),
        commit_interval=timedelta(milliseconds=20),
        handle_signals=False,
    )

    @events.on("*")
    async def handle(item: FileEvent) -> None:
        log.append(("start", item.id))
        if item.id == first_a.id and failures_left[0]:
            failures_left[0] -= 1
            raise RuntimeError("not yet")
        log.append(("done", item.id))

    async def scenario() -> dict[int, tuple[int, str]]:
        await create_topics(kafka_bootstrap, (topic, 1))
        await produce_events(kafka_bootstrap, topic, [first_a, later_a, *bs])
        task = asyncio.create_task(events.run())
        try:
            await eventually(
                lambda: all(("done", b.id) in log for b in bs), 30, "b's events, while a retries"
            )
            assert ("done", first_a.id) not in log
            await asyncio.sleep(0.3)  # a commit or more
            during.extend((await committed_with_metadata(kafka_bootstrap, group, topic)).values())
            await eventually(lambda: ("done", later_a.id) in log, 30, "a's events")
            await eventually(lambda: events.outcomes[Outcome.HANDLED.value] == 7, 5, "the outcomes")
        finally:
            events.stop()
            await asyncio.wait_for(task, 30)
        return await committed_with_metadata(kafka_bootstrap, group, topic)

    final = asyncio.run(scenario())
    order = [item for step, item in log if step == "done"]
    assert order.index(first_a.id) < order.index(later_a.id)
    assert all(order.index(b.id) < order.index(first_a.id) for b in bs)
    assert log.index(("start", later_a.id)) > log.index(("done", first_a.id))
    # During the retries: committed up to a's first event (offset 0), b's (2..6) recorded.
    assert len(during) == 1
    offset, metadata = during[0]
    assert offset == 0
    assert decode_finished(offset, metadata) == {2, 3, 4, 5, 6}
    assert final == {0: (7, "")}


class CountingStore:
    """A store of its own (not in process, as far as the library knows): its calls counted."""

    def __init__(self) -> None:
        self.held = MemoryDedupeStore()
        self.lookups: list[int] = []
        self.records: list[int] = []

    async def has_many(self, event_ids: Sequence[str]) -> list[bool]:
        self.lookups.append(len(event_ids))
        return await self.held.has_many(event_ids)

    async def add_many(self, event_ids: Sequence[str], ttl: timedelta) -> None:
        self.records.append(len(event_ids))
        await self.held.add_many(event_ids, ttl)


@pytest.mark.kafka
def test_a_restart_skips_the_events_done_above_the_commit_point(kafka_bootstrap: str) -> None:
    """The first member is cancelled while one event hangs: the nine after it, handled,
    are in the commit's metadata; the next member runs the hanging one alone. Lookups in
    the dedupe store went in batches."""
    topic, group = unique("events"), unique("group")
    stuck = event("slow/0.bin", 0)
    rest = [event(f"fast/{seq}.bin", seq) for seq in range(1, 10)]
    store = CountingStore()
    runs: list[str] = []

    def consumer() -> FileEvents:
        events = FileEvents(
            bootstrap_servers=kafka_bootstrap,
            topic=topic,
            group_id=group,
            dedupe=store,
            dedupe_legacy_window=timedelta(0),
            commit_interval=timedelta(milliseconds=20),
            handle_signals=False,
        )

        @events.on("*")
        async def handle(item: FileEvent) -> None:
            runs.append(item.id)
            if item.id == stuck.id and runs.count(item.id) == 1:
                await asyncio.sleep(3600)

        return events

    first, second = consumer(), consumer()

    async def scenario() -> dict[int, tuple[int, str]]:
        await create_topics(kafka_bootstrap, (topic, 1))
        await produce_events(kafka_bootstrap, topic, [stuck, *rest])
        task = asyncio.create_task(first.run())
        await eventually(lambda: len(runs) == 10, 30, "ten events started")
        await eventually(lambda: first.outcomes[Outcome.HANDLED.value] == 9, 5, "nine handled")
        task.cancel()  # abrupt: the hanging event is not done with
        with pytest.raises(asyncio.CancelledError):
            await task
        between = await committed_with_metadata(kafka_bootstrap, group, topic)
        task = asyncio.create_task(second.run())
        try:
            await eventually(lambda: runs.count(stuck.id) == 2, 30, "the hanging event again")
            await eventually(lambda: second.outcomes[Outcome.HANDLED.value] == 1, 5, "the outcome")
        finally:
            second.stop()
            await asyncio.wait_for(task, 30)
        return between

    between = asyncio.run(scenario())
    offset, metadata = between[0]
    assert offset == 0
    assert decode_finished(offset, metadata) == set(range(1, 10))
    assert sorted(runs) == sorted([stuck.id, stuck.id, *(item.id for item in rest)])
    assert second.outcomes == {Outcome.HANDLED.value: 1, Outcome.DONE_BEFORE.value: 9}
    assert first.outcomes == {Outcome.HANDLED.value: 9}
    # A start-up check per run, then 10 + 1 lookups of one id each (no legacy window):
    # those of the events started together went in one call.
    assert sum(store.lookups) == 2 + 11 and max(store.lookups) > 1
    assert sum(store.records) == 10
