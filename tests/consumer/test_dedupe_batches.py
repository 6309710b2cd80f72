"""The dedupe store asked in batches: a fetched batch's lookups in one exchange, the ids of
handled events written in batches without a task waiting for them.

What must hold (fileevents/README.md, "Dedupe" and "Commits"): an event is done with, and its
offset may be committed, only once its id's write is acknowledged; a write or a lookup that
fails is retried (reported to `on_error` as `<dedupe>`, never final), and a failed lookup never
makes an event new nor a duplicate. A store that is not in-process goes through the batches
(`MemoryDedupeStore` is asked directly), so these stores are plain classes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta

import pytest
import redis.asyncio as redis
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from consumer_support import (
    ce_headers,
    committed,
    create_topics,
    event,
    eventually,
    produce_events,
    unique,
)
from support.redis_server import RedisServer

from fileevents import Failure, FileEvent, FileEvents, Outcome, RedisDedupeStore, RetryPolicy
from fileevents.deadletter import DeadLetterWriter
from fileevents.dedupe import DedupeBatcher, dedupe_id
from fileevents.partition import PartitionState
from fileevents.processing import EventProcessor, Job
from fileevents.registry import Registry


class SetStore:
    """A dedupe store in a set (TTL ignored), as a remote one is asked: in batches."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.lookups: list[list[str]] = []
        self.writes: list[list[str]] = []

    async def has_many(self, event_ids: Sequence[str]) -> list[bool]:
        self.lookups.append(list(event_ids))
        return [one in self.ids for one in event_ids]

    async def add_many(self, event_ids: Sequence[str], ttl: timedelta) -> None:
        self.writes.append(list(event_ids))
        self.ids.update(event_ids)


class FailingWrites(SetStore):
    """Refuses every write while `failing` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True

    async def add_many(self, event_ids: Sequence[str], ttl: timedelta) -> None:
        if self.failing:
            raise ConnectionError("dedupe store refuses writes")
        await super().add_many(event_ids, ttl)


class FailingLookups(SetStore):
    """Answers the start-up check, then fails the next `outage` lookups."""

    def __init__(self, outage: int) -> None:
        super().__init__()
        self.outage = outage
        self.checked = False

    async def has_many(self, event_ids: Sequence[str]) -> list[bool]:
        if self.checked and self.outage:
            self.outage -= 1
            raise ConnectionError("dedupe store unreachable")
        self.checked = True
        return await super().has_many(event_ids)


def consumer(bootstrap: str, topic: str, group: str, store: object, **more: object) -> FileEvents:
    return FileEvents(
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=group,
        dedupe=store,  # type: ignore[arg-type]
        retry=RetryPolicy(attempts=1, initial_backoff=timedelta(milliseconds=20)),
        commit_interval=timedelta(milliseconds=20),
        handle_signals=False,
        **more,  # type: ignore[arg-type]
    )


@pytest.mark.kafka
def test_a_failing_write_holds_the_commit_before_its_event(kafka_bootstrap: str) -> None:
    topic, group = unique("events"), unique("group")
    items = [event(f"docs/{index}.txt", 1) for index in range(3)]  # three keys, one partition
    store = FailingWrites()
    failures: list[Failure] = []
    runs: Counter[str] = Counter()
    events = consumer(kafka_bootstrap, topic, group, store, on_error=failures.append)

    @events.on("*")
    async def handle(item: FileEvent) -> None:
        runs[item.id] += 1

    async def scenario() -> tuple[dict[int, int], dict[int, int]]:
        await create_topics(kafka_bootstrap, (topic, 1))
        await produce_events(kafka_bootstrap, topic, items)
        task = asyncio.create_task(events.run())
        try:
            # Every handler ran, and every write failed twice at least (each retried once,
            # after 20 ms, while commits were due every 20 ms).
            await eventually(
                lambda: task.done() or (len(runs) == 3 and len(failures) >= 6), 30, "failures"
            )
            while_failing = await committed(kafka_bootstrap, group, topic)
            store.failing = False
            await eventually(
                lambda: task.done() or events.outcomes[Outcome.HANDLED.value] == 3, 30, "writes"
            )
            await eventually(lambda: task.done() or events.outcomes.total() == 3, 30, "done")
        finally:
            events.stop()
            await asyncio.wait_for(task, 30)
        return while_failing, await committed(kafka_bootstrap, group, topic)

    while_failing, after = asyncio.run(scenario())
    assert while_failing.get(0, 0) == 0, "the commit passed events whose ids were not written"
    assert after == {0: 3}
    assert runs == {item.id: 1 for item in items}, "a handler ran again"
    assert store.ids == {dedupe_id(group, item) for item in items}
    assert {(f.handler, f.final) for f in failures} == {("<dedupe>", False)}
    assert events.outcomes == {Outcome.HANDLED.value: 3}


@pytest.mark.kafka
def test_a_failing_batch_lookup_is_retried_never_taken_for_an_answer(
    kafka_bootstrap: str,
) -> None:
    topic, group = unique("events"), unique("group")
    done_before, new = event("a/seen.txt", 1), event("b/new.txt", 1)
    store = FailingLookups(outage=2)
    store.ids.add(dedupe_id(group, done_before))
    failures: list[Failure] = []
    runs: list[str] = []
    events = consumer(
        kafka_bootstrap,
        topic,
        group,
        store,
        on_error=failures.append,
        dedupe_legacy_window=timedelta(0),
    )

    @events.on("*")
    async def handle(item: FileEvent) -> None:
        runs.append(item.id)

    async def scenario() -> None:
        await create_topics(kafka_bootstrap, (topic, 1))
        await produce_events(kafka_bootstrap, topic, [done_before, new])
        task = asyncio.create_task(events.run())
        try:
            await eventually(lambda: task.done() or events.outcomes.total() == 2, 30, "both")
        finally:
            events.stop()
            await asyncio.wait_for(task, 30)

    asyncio.run(scenario())
    assert runs == [new.id], "an event the store holds ran, or a new one did not"
    assert events.outcomes == {Outcome.HANDLED.value: 1, Outcome.DUPLICATE.value: 1}
    assert failures, "the failed lookups were not reported"
    assert {(f.handler, f.final) for f in failures} == {("<dedupe>", False)}
    assert store.outage == 0


@pytest.mark.kafka
def test_a_fetched_batch_is_looked_up_and_written_in_few_exchanges(kafka_bootstrap: str) -> None:
    topic, group = unique("events"), unique("group")
    items = [event(f"photos/{index:03d}.jpg", 1) for index in range(200)]
    store = SetStore()
    events = consumer(
        kafka_bootstrap, topic, group, store, dedupe_legacy_window=timedelta(0), max_concurrency=64
    )

    @events.on("*")
    async def handle(item: FileEvent) -> None:
        return None

    async def scenario() -> None:
        await create_topics(kafka_bootstrap, (topic, 1))
        await produce_events(kafka_bootstrap, topic, items)
        task = asyncio.create_task(events.run())
        try:
            await eventually(lambda: task.done() or events.outcomes.total() == 200, 30, "all")
        finally:
            events.stop()
            await asyncio.wait_for(task, 30)

    asyncio.run(scenario())
    assert events.outcomes == {Outcome.HANDLED.value: 200}
    looked_up = [one for batch in store.lookups[1:] for one in batch]  # [0]: start-up check
    written = [one for batch in store.writes for one in batch]
    assert sorted(looked_up) == sorted(written) == sorted(dedupe_id(group, i) for i in items)
    # One lookup per fetch, not one per event (200 events fetched in a few batches).
    assert len(store.lookups) - 1 < 20
    assert len(store.writes) < 100


def test_the_redis_exchange_reads_and_writes_the_keys_the_single_calls_do(
    redis_server: RedisServer,
) -> None:
    """The script takes the ids as JSON and builds the keys itself: the same keys as
    `has_many` / `add_many` (MGET / SET), whatever the ids hold."""
    odd = ["a\x00b", 'é🎉\n"\\x', "plain", "\u2028z", "x" * 600]

    async def scenario() -> tuple[list[bool], list[bool], list[bool], list[bool]]:
        client = redis.Redis.from_url(redis_server.url)
        try:
            store = RedisDedupeStore(client, prefix=unique("odd") + ":")
            exchange = store.exchange()
            assert exchange is not None
            ttl = timedelta(minutes=1)
            first = await exchange(odd[:2], odd, ttl)
            by_mget = await store.has_many(odd)
            await store.add_many(odd[2:3], ttl)
            again = await exchange([], odd, ttl)
            text_client = redis.Redis.from_url(redis_server.url, decode_responses=True)
            try:
                texts = RedisDedupeStore(text_client, prefix=store.redis_key("")).exchange()
                assert texts is not None
                decoded = await texts([], odd, ttl)
            finally:
                await text_client.aclose()
            assert await client.pttl(store.redis_key(odd[0])) > 50_000
            return first, by_mget, again, decoded
        finally:
            await client.aclose()

    first, by_mget, again, decoded = asyncio.run(scenario())
    assert first == [True, True, False, False, False]  # written first, then looked up
    assert by_mget == first
    assert again == decoded == [True, True, True, False, False]


def test_an_answer_read_ahead_under_another_id_is_not_used() -> None:
    """The lookup made ahead reads only what an id is made of (`codec.read_identity`); the
    event read as it starts is what counts: when its id differs, it is looked up again
    under its own, the answer made ahead is not taken."""
    item = event("notes/today.md", 1)
    value = item.model_dump_json().encode()
    record = ConsumerRecord(
        topic="t",
        partition=0,
        offset=0,
        timestamp=0,
        timestamp_type=0,
        key=item.key.encode(),
        value=value,
        checksum=None,
        serialized_key_size=0,
        serialized_value_size=len(value),
        headers=ce_headers(item),
    )
    runs: list[str] = []

    async def handle(received: FileEvent) -> None:
        runs.append(received.id)

    async def scenario() -> object:
        registry = Registry()
        registry.add("*", handle)
        store = SetStore()
        processor = EventProcessor(
            registry,
            "g",
            RetryPolicy(),
            DeadLetterWriter(None, "dlq"),  # type: ignore[arg-type]
            lambda failure: None,
            dedupe=store,
            dedupe_legacy_window=timedelta(0),
        )
        job = Job(PartitionState(TopicPartition("t", 0)), record)
        job.lookup = asyncio.get_running_loop().create_future()
        job.lookup.set_result([True])  # "seen", but under another id than the event's
        job.seen_id, job.size = "g|s3|another", 1
        outcome = await processor.process(job)
        assert job.seen_id == dedupe_id("g", item)
        await processor.close()
        return outcome

    outcome = asyncio.run(scenario())
    assert outcome is None, "the answer read ahead under another id was taken"  # RECORDING
    assert runs == [item.id]


class GatedStore(SetStore):
    """Holds each write and lookup until its gate is opened; counts the calls in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.writes_open = asyncio.Event()
        self.lookups_open = asyncio.Event()
        self.lookups_open.set()
        self.writing = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.failing_lookups = 0
        """How many of the next lookups fail."""

    async def _gated(self, gate: asyncio.Event) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await gate.wait()
        finally:
            self.in_flight -= 1

    async def has_many(self, event_ids: Sequence[str]) -> list[bool]:
        await self._gated(self.lookups_open)
        if self.failing_lookups:
            self.failing_lookups -= 1
            raise ConnectionError("dedupe store unreachable")
        return await super().has_many(event_ids)

    async def add_many(self, event_ids: Sequence[str], ttl: timedelta) -> None:
        self.writing.set()
        await self._gated(self.writes_open)
        await super().add_many(event_ids, ttl)


def test_lookups_go_out_while_a_write_is_in_flight_two_exchanges_at_most() -> None:
    """A lookup asked for while the pump's exchange (a write) is in flight goes at once, in
    a second exchange of lookups only, not after the write; a third waits for one of them."""
    store = GatedStore()
    written: list[list[str]] = []
    failed: list[list[str]] = []

    async def scenario() -> tuple[list[bool], list[bool], str]:
        batcher = DedupeBatcher(
            store,
            timedelta(minutes=1),
            on_written=written.append,
            on_write_failed=lambda items, error: failed.append(items),
        )
        try:
            batcher.write("w1", "item-1")
            await asyncio.wait_for(store.writing.wait(), 5)
            early = await asyncio.wait_for(batcher.look_up(["x", "w1"]), 5)
            assert not written, "the write was acknowledged before its store call returned"
            store.lookups_open.clear()  # the next lookup stays in flight with the write
            held = batcher.look_up(["y"])
            await eventually(lambda: store.in_flight == 2, 5, "a second exchange")
            third = batcher.look_up(["w1"])
            await asyncio.sleep(0.05)
            assert store.in_flight == 2 and not third.done()
            store.failing_lookups = 1  # a lookup that fails: its future says so
            store.lookups_open.set()
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(held, 5)
            store.writes_open.set()
            late = await asyncio.wait_for(third, 5)
            await eventually(lambda: bool(written), 5, "the write's acknowledgement")
            return early, late, repr(store.most_in_flight)
        finally:
            await batcher.close()

    early, late, most = asyncio.run(scenario())
    assert early == [False, False]
    assert written == [["item-1"]] and not failed, "a failed lookup touched the write"
    assert store.ids == {"w1"}
    assert most == "2", "more than two exchanges were in flight"
    assert late in ([True], [False])  # after the write, or beside it: either is an answer


class SlowWrites(SetStore):
    """Writes that take a while; every call logged in the order it is made or acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str]] = []
        self.writing = 0
        self.beside_writes = 0
        """Lookups made while a write was in flight."""

    async def has_many(self, event_ids: Sequence[str]) -> list[bool]:
        self.log.extend(("looked up", one) for one in event_ids)
        self.beside_writes += self.writing > 0
        return await super().has_many(event_ids)

    async def add_many(self, event_ids: Sequence[str], ttl: timedelta) -> None:
        self.writing += 1
        try:
            await asyncio.sleep(0.01)
            await super().add_many(event_ids, ttl)
        finally:
            self.writing -= 1
        self.log.extend(("written", one) for one in event_ids)


@pytest.mark.kafka
def test_with_lookups_beside_writes_a_key_s_lookup_still_follows_its_last_write(
    kafka_bootstrap: str,
) -> None:
    """Lookups go out beside writes in flight, yet an event is looked up only after this
    consumer's write of its key's event before it was acknowledged: a copy right behind an
    event of its key is a duplicate, every event runs once."""
    topic, group = unique("events"), unique("group")
    items = [event(f"k{key:03d}.bin", seq) for seq in range(1, 5) for key in range(300)]
    copies = [event(f"k{key:03d}.bin", 4) for key in range(0, 300, 3)]
    store = SlowWrites()
    runs: Counter[str] = Counter()
    events = consumer(
        kafka_bootstrap,
        topic,
        group,
        store,
        dedupe_legacy_window=timedelta(0),
        max_concurrency=16,  # fetches of 500 come while the writes of the one before run
    )

    @events.on("*")
    async def handle(item: FileEvent) -> None:
        runs[item.id] += 1

    total = len(items) + len(copies)

    async def scenario() -> None:
        await create_topics(kafka_bootstrap, (topic, 2))
        await produce_events(kafka_bootstrap, topic, [*items, *copies])
        task = asyncio.create_task(events.run())
        try:
            await eventually(lambda: task.done() or events.outcomes.total() == total, 30, "all")
        finally:
            events.stop()
            await asyncio.wait_for(task, 30)

    asyncio.run(scenario())
    assert events.outcomes == {Outcome.HANDLED.value: len(items), Outcome.DUPLICATE.value: 100}
    assert runs == {item.id: 1 for item in items}
    assert store.beside_writes, "no lookup went out while a write was in flight"
    at = {entry: index for index, entry in enumerate(store.log)}
    for item in items:
        if item.sequencer == "00000001":
            continue
        before = event(item.key, int(item.sequencer or "0") - 1)
        assert at[("looked up", dedupe_id(group, item))] > at[("written", dedupe_id(group, before))]
