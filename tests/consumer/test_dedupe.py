"""The dedupe store: a redelivered id is skipped, a failed event is never recorded.

Run with the in-process store and with `RedisDedupeStore` on a real `redis-server`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta

import pytest
import redis.asyncio as redis
from consumer_support import (
    create_topics,
    event,
    produce_events,
    reset_offsets,
    run_until,
    unique,
)
from support.payloads import b2_body, gcs_pull, gcs_resource
from support.redis_server import RedisServer

from fileevents import (
    DedupeStore,
    Failure,
    FileEvent,
    FileEvents,
    MemoryDedupeStore,
    Outcome,
    RedisDedupeStore,
    RetryPolicy,
)
from fileevents.dedupe import dedupe_id, legacy_dedupe_id
from streams.core.delivery import Delivery
from streams.core.normalizers import normalize

BuiltInStore = MemoryDedupeStore | RedisDedupeStore
StoreFactory = Callable[[], AbstractAsyncContextManager[BuiltInStore]]


@pytest.fixture(params=["memory", "redis"])
def store_factory(request: pytest.FixtureRequest) -> StoreFactory:
    if request.param == "memory":
        shared = MemoryDedupeStore()

        @asynccontextmanager
        async def memory() -> AsyncIterator[BuiltInStore]:
            yield shared

        return memory
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = unique("seen") + ":"

    @asynccontextmanager
    async def on_redis() -> AsyncIterator[BuiltInStore]:
        client = redis.Redis.from_url(server.url)
        try:
            yield RedisDedupeStore(client, prefix=prefix)
        finally:
            await client.aclose()

    return on_redis


@pytest.mark.kafka
def test_redelivered_ids_skipped_failed_ones_not_recorded(
    kafka_bootstrap: str, store_factory: StoreFactory
) -> None:
    topic, group = unique("events"), unique("group")
    key = "mail/outbox.eml"
    sent_once, fails, later = event(key, 1), event(key, 2), event(key, 3)
    # The stream can emit a change twice after a crash: same id, same bytes, new offset.
    records = [sent_once, fails, sent_once, later, fails]
    runs: Counter[str] = Counter()

    def consumer(store: DedupeStore) -> FileEvents:
        events = FileEvents(
            bootstrap_servers=kafka_bootstrap,
            topic=topic,
            group_id=group,
            dedupe=store,
            dedupe_ttl=timedelta(minutes=5),
            retry=RetryPolicy(attempts=2, initial_backoff=timedelta(milliseconds=10)),
            on_error=lambda failure: None,
            handle_signals=False,
        )

        @events.on("created")
        async def send_mail(item: FileEvent) -> None:
            runs[item.id] += 1
            if item.id == fails.id:
                raise RuntimeError("smtp refused")

        return events

    def done_with(events: FileEvents, count: int) -> Callable[[], bool]:
        return lambda: sum(events.outcomes.values()) == count

    async def scenario() -> tuple[FileEvents, FileEvents, dict[str, bool]]:
        await create_topics(kafka_bootstrap, (topic, 3), (f"{topic}.dead-letter", 1))
        await produce_events(kafka_bootstrap, topic, records)
        async with store_factory() as store:
            first = consumer(store)
            await run_until(first, done_with(first, len(records)), "every record, first run")
            # Redelivery of everything (as after a lost commit): a new consumer, same group.
            await reset_offsets(kafka_bootstrap, group, topic)
            second = consumer(store)
            await run_until(second, done_with(second, len(records)), "every record, again")
            recorded = {
                item.id: await store.has(dedupe_id(group, item))
                for item in (sent_once, fails, later)
            }
        return first, second, recorded

    first, second, recorded = asyncio.run(scenario())

    assert runs[sent_once.id] == 1, "a redelivered id ran again"
    assert runs[later.id] == 1
    # Never recorded, so every copy ran its attempts (2 copies x 2 attempts x 2 runs).
    assert runs[fails.id] == 8
    assert recorded == {sent_once.id: True, fails.id: False, later.id: True}
    assert first.outcomes == {
        Outcome.HANDLED.value: 2,
        Outcome.DUPLICATE.value: 1,
        Outcome.DEAD_LETTERED.value: 2,
    }
    assert second.outcomes == {Outcome.DUPLICATE.value: 3, Outcome.DEAD_LETTERED.value: 2}


def test_redis_store_sets_once_with_a_ttl(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        client = redis.Redis.from_url(redis_server.url)
        try:
            store = RedisDedupeStore(client, prefix=unique("ttl") + ":")
            assert not await store.has("a")
            await store.add("a", timedelta(seconds=100))
            assert await store.has("a")
            assert await client.get(store.redis_key("a")) == b"1"
            assert 99_000 < await client.pttl(store.redis_key("a")) <= 100_000
            # NX: adding again neither renews nor lengthens the first TTL.
            await store.add("a", timedelta(hours=1))
            assert await client.pttl(store.redis_key("a")) <= 100_000
            # Redis expires ids itself.
            await store.add("short", timedelta(milliseconds=30))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while await store.has("short"):
                assert loop.time() < deadline, "the id did not expire"
                await asyncio.sleep(0.01)
            assert await store.has("a")
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_memory_store_expires_and_stays_bounded() -> None:
    now = [0.0]
    store = MemoryDedupeStore(clock=lambda: now[0])

    async def scenario() -> None:
        await store.add("a", timedelta(seconds=10))
        await store.add("a", timedelta(seconds=1000))  # does not lengthen
        assert await store.has("a")
        now[0] = 10.0
        assert not await store.has("a")
        for index in range(2048):
            await store.add(f"id-{index}", timedelta(seconds=1))
            now[0] += 0.01
        assert len(store) < 2048  # the sweeps dropped what expired
        with pytest.raises(ValueError):
            await store.add("b", timedelta(0))

    asyncio.run(scenario())


class FlakyStore(MemoryDedupeStore):
    """A store that answers `run()`'s start-up check, then is unreachable for the next
    `outage` calls: an outage while the consumer runs."""

    def __init__(self, outage: int) -> None:
        super().__init__()
        self.outage = outage
        self.checked = False

    async def has_many(self, event_ids: Sequence[str]) -> list[bool]:
        if not self.checked:
            self.checked = True
            return await super().has_many(event_ids)
        if self.outage:
            self.outage -= 1
            raise ConnectionError("dedupe store unreachable")
        return await super().has_many(event_ids)


@pytest.mark.kafka
def test_a_store_outage_delays_events_but_never_dead_letters_them(kafka_bootstrap: str) -> None:
    topic, group = unique("events"), unique("group")
    item = event("notes/today.md", 1)
    store = FlakyStore(outage=3)
    failures: list[Failure] = []
    runs: list[str] = []
    events = FileEvents(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        group_id=group,
        dedupe=store,
        retry=RetryPolicy(attempts=1, initial_backoff=timedelta(milliseconds=10)),
        on_error=failures.append,
        handle_signals=False,
    )

    @events.on("*")
    async def handle(received: FileEvent) -> None:
        runs.append(received.id)

    async def scenario() -> None:
        await create_topics(kafka_bootstrap, (topic, 1))
        await produce_events(kafka_bootstrap, topic, [item])
        await run_until(events, lambda: runs, "the event, once the store answers")

    asyncio.run(scenario())
    assert runs == [item.id]
    assert [(f.handler, f.attempt, f.final) for f in failures] == [
        ("<dedupe>", 1, False),
        ("<dedupe>", 2, False),
        ("<dedupe>", 3, False),
    ]
    assert events.outcomes == {Outcome.HANDLED.value: 1}
    assert asyncio.run(store.has(dedupe_id(group, item)))


# --- issue 31, item 1: one provider's ids never meet another's ---------------------------------


def delivered(value: bytes, headers: list[tuple[str, bytes]]) -> FileEvent:
    """The one canonical event the stream's normalizer makes of a raw delivery."""
    found = dict(headers)
    [made] = normalize(
        Delivery(
            source=found["source"].decode(),
            body=value,
            attributes={
                name.removeprefix("attribute."): v.decode()
                for name, v in headers
                if name.startswith("attribute.")
            },
        )
    )
    return made


@pytest.mark.kafka
def test_a_b2_event_id_equal_to_a_gcs_change_s_id_does_not_make_it_a_duplicate(
    kafka_bootstrap: str, store_factory: StoreFactory
) -> None:
    """An instance taking `gcs` and `b2`: a B2 credential posts an event whose `eventId` is the
    id GCS's delete of the same object will have (derived from type, bucket, key and
    generation: predictable). The stream emits both (its dedupe is per provider); the
    consumer's store must not take the real delete for a copy of the B2 event."""
    topic, group = unique("events"), unique("group")
    name = f"{unique('docs')}/contract.pdf"
    resource = gcs_resource(name, "1700000000000001", bucket="uploads")
    created = delivered(*gcs_pull(resource, "OBJECT_FINALIZE"))
    deleted = delivered(*gcs_pull(resource, "OBJECT_DELETE"))
    attack = delivered(b2_body(name, deleted.id), [("source", b"b2")])
    assert (attack.provider, attack.id) == ("b2", deleted.id) and deleted.provider == "gcs"
    handled: list[tuple[str, str, str]] = []

    async def scenario() -> FileEvents:
        await create_topics(kafka_bootstrap, (topic, 1), (f"{topic}.dead-letter", 1))
        # In the order the stream emits them: one key, one partition.
        await produce_events(kafka_bootstrap, topic, [created, attack, deleted])
        async with store_factory() as store:
            consumer = FileEvents(
                bootstrap_servers=kafka_bootstrap,
                topic=topic,
                group_id=group,
                dedupe=store,
                on_error=lambda failure: None,
                handle_signals=False,
            )

            @consumer.on("*")
            async def sync(item: FileEvent) -> None:
                handled.append((item.provider, item.type, item.id))

            await run_until(
                consumer, lambda: sum(consumer.outcomes.values()) == 3, "the three events"
            )
        return consumer

    events = asyncio.run(scenario())
    assert handled == [
        ("gcs", "created", created.id),
        ("b2", "created", deleted.id),
        ("gcs", "deleted", deleted.id),  # the real delete: not a duplicate of the B2 event
    ]
    assert events.outcomes == {Outcome.HANDLED.value: 3}


@pytest.mark.kafka
def test_ids_recorded_before_scopes_are_read_within_the_upgrade_window(
    kafka_bootstrap: str, store_factory: StoreFactory
) -> None:
    """A store written by the previous version holds `<group>:<id>`. Within the window an
    event of that id is still a duplicate, recorded under its scoped id only; with the window
    closed (`dedupe_legacy_window=timedelta(0)`) the old entry is not read."""
    topic, group = unique("events"), unique("group")
    before, after = event("notes/before.md", 1), event("notes/after.md", 2)
    runs: list[str] = []

    def consumer(store: DedupeStore, window: timedelta | None) -> FileEvents:
        events = FileEvents(
            bootstrap_servers=kafka_bootstrap,
            topic=topic,
            group_id=group,
            dedupe=store,
            dedupe_legacy_window=window,
            on_error=lambda failure: None,
            handle_signals=False,
        )

        @events.on("*")
        async def handle(item: FileEvent) -> None:
            runs.append(item.id)

        return events

    async def scenario() -> tuple[FileEvents, FileEvents, list[bool]]:
        await create_topics(kafka_bootstrap, (topic, 1), (f"{topic}.dead-letter", 1))
        await produce_events(kafka_bootstrap, topic, [before, after])
        async with store_factory() as store:
            # As the previous version recorded `before` once it handled it.
            await store.add(f"{group}:{before.id}", timedelta(minutes=5))
            assert legacy_dedupe_id(group, before) == f"{group}:{before.id}"
            upgraded = consumer(store, None)
            await run_until(upgraded, lambda: sum(upgraded.outcomes.values()) == 2, "both")
            recorded = [
                await store.has(dedupe_id(group, before)),
                await store.has(dedupe_id(group, after)),
                await store.has(legacy_dedupe_id(group, after)),  # the old form: never written
            ]
            await reset_offsets(kafka_bootstrap, group, topic)
            closed = consumer(store, timedelta(0))
            await store.add(f"{group}:{after.id}", timedelta(minutes=5))
            await run_until(closed, lambda: sum(closed.outcomes.values()) == 2, "both again")
        return upgraded, closed, recorded

    upgraded, closed, recorded = asyncio.run(scenario())
    assert dedupe_id(group, before) == f"{group}|s3|{before.id}"
    assert upgraded.outcomes == {Outcome.DUPLICATE.value: 1, Outcome.HANDLED.value: 1}
    assert recorded == [False, True, False]
    # Window closed: `before` (only under its old key) runs; `after` is a duplicate by its
    # scoped id, and its old-form entry changes nothing.
    assert closed.outcomes == {Outcome.HANDLED.value: 1, Outcome.DUPLICATE.value: 1}
    assert runs == [after.id, before.id]


def test_memory_store_does_not_sweep_before_anything_can_have_expired() -> None:
    now = [0.0]
    store = MemoryDedupeStore(clock=lambda: now[0])

    async def scenario() -> None:
        held = store._expiry
        for index in range(5_000):  # past several sweep points, nothing expired yet
            await store.add(f"id-{index}", timedelta(hours=1))
            now[0] += 0.1
        assert store._expiry is held  # never copied (a copy per 1,024 adds was the cost)
        assert len(store) == 5_000
        now[0] = 3_600.05  # the first ids have expired: the next sweep point drops them
        for index in range(1_024):
            await store.add(f"late-{index}", timedelta(hours=1))
        assert 1_024 < len(store) < 6_024

    asyncio.run(scenario())
