"""The fileevents distribution on its own: what it imports, and a consumer against a real
broker, with the in-memory and the Redis dedupe store (the `[redis]` extra).

dev/fileevents-alone.sh runs this in fresh virtualenvs of Python 3.10 and 3.13 holding
`pip install ./fileevents[test]` and nothing of the stream (FILEEVENTS_DIST_ALONE=1)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import fileevents
from fileevents import (
    EventContext,
    Failure,
    FileEvent,
    FileEvents,
    MemoryDedupeStore,
    RedisDedupeStore,
    RetryPolicy,
)
from fileevents.event import UTC, format_time, printable, scope  # UTC: 3.10 has no datetime.UTC

ALONE = os.environ.get("FILEEVENTS_DIST_ALONE") == "1"


@pytest.mark.skipif(not ALONE, reason="only where the distribution is installed alone")
def test_installed_alone_without_the_stream() -> None:
    """The distribution's dependencies are the consumer's: no stream, no Faust, no SDKs."""
    for absent in ("streams", "connectors", "faust", "rocksdict", "boto3", "google.cloud"):
        try:
            found = importlib.util.find_spec(absent)
        except ModuleNotFoundError:  # a dotted name whose parent is not there
            found = None
        assert found is None, f"{absent} is importable in the consumer's own environment"
    source = Path(fileevents.__file__).resolve()
    assert "site-packages" in source.parts, f"fileevents imported from {source}, not installed"


def test_the_contract_imports_nothing_of_the_consumer() -> None:
    """`fileevents.event` (what the stream imports) loads no Kafka client, metrics or Redis."""
    probe = (
        "import sys, fileevents.event; "
        "print(','.join(sorted(m.split('.')[0] for m in sys.modules "
        "if m.split('.')[0] in ('aiokafka', 'prometheus_client', 'redis', 'streams'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_the_contract() -> None:
    """The model reads what the stream writes, and its helpers are the stream's."""
    event = FileEvent.model_validate_json(
        b'{"id":"e1","type":"created","key":"a/b.txt","bucket":"uploads","size":3,'
        b'"etag":null,"version_id":null,"time":"2026-12-07T08:00:00+01:00","sequencer":null,'
        b'"provider":"s3","version_only":null,"raw":{"awsRegion":"cn-north-1"}}'
    )
    assert event.time == datetime(2026, 12, 7, 7, tzinfo=UTC)
    assert format_time(event.time) == "2026-12-07T07:00:00Z"
    assert '"time":"2026-12-07T07:00:00Z"' in event.model_dump_json()
    assert scope(event) == "s3@aws-cn"
    assert printable("a\nb") == "a\\nb"
    assert fileevents.FileEvent is FileEvent


def canonical(key: str, seq: int, id_: str | None = None) -> FileEvent:
    return FileEvent(
        id=id_ or f"s3:{key}:{seq}",
        type="created",
        key=key,
        bucket="uploads",
        size=seq,
        time=datetime(2026, 12, 7, 0, 0, seq, tzinfo=UTC),
        sequencer=f"{seq:08d}",
        provider="s3",
        raw={"seq": seq},
    )


async def make_topic(bootstrap: str, partitions: int) -> str:
    topic = f"files.events.dist-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(topic, num_partitions=partitions, replication_factor=1),
                NewTopic(f"{topic}.dead-letter", num_partitions=1, replication_factor=1),
            ]
        )
    finally:
        await admin.close()
    return topic


async def produce(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key.encode())
    finally:
        await producer.stop()


async def run_until(events: FileEvents, done: Callable[[], bool], timeout_s: float = 60) -> None:
    """Run `events` until `done()` holds, then stop it gracefully; fail if it never does."""
    task = asyncio.create_task(events.run())
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not done():
            if task.done():
                task.result()  # what ended run() early
                pytest.fail("run() returned before the condition held")
            if asyncio.get_running_loop().time() > deadline:
                pytest.fail(f"not done within {timeout_s} s: {events.outcomes}")
            await asyncio.sleep(0.05)
    finally:
        events.stop()
        await asyncio.wait_for(task, 60)


async def dead_letters(bootstrap: str, topic: str, count: int) -> list[bytes | None]:
    consumer = AIOKafkaConsumer(
        f"{topic}.dead-letter", bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        values: list[bytes | None] = []
        while len(values) < count:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
            values.extend(record.value for records in batch.values() for record in records)
        return values
    finally:
        await consumer.stop()


async def committed(bootstrap: str, topic: str, group: str, partitions: int) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        total = 0
        for partition in range(partitions):
            offset = await consumer.committed(TopicPartition(topic, partition))
            total += offset or 0
        return total
    finally:
        await consumer.stop()


def run(coroutine: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coroutine())  # type: ignore[arg-type]


@pytest.mark.kafka
def test_handles_in_key_order_dead_letters_and_commits(bootstrap: str) -> None:
    """Events of two keys in order, a duplicate skipped (MemoryDedupeStore), a record that is
    not an event dead-lettered, every offset committed."""

    async def scenario() -> None:
        topic = await make_topic(bootstrap, partitions=2)
        events_ = [canonical(f"k{seq % 2}", seq) for seq in range(1, 9)]
        records = [(item.key, item.model_dump_json().encode()) for item in events_]
        records.append(("k0", events_[0].model_dump_json().encode()))  # a copy: a duplicate
        records.append(("k1", b"{not json"))
        await produce(bootstrap, topic, records)
        group = f"dist-{uuid.uuid4().hex[:8]}"
        seen: list[tuple[str, int, int]] = []
        app = FileEvents(
            bootstrap_servers=bootstrap,
            topic=topic,
            group_id=group,
            dedupe=MemoryDedupeStore(),
            commit_interval=timedelta(milliseconds=100),
            handle_signals=False,
        )

        @app.on("created")
        async def handle(event: FileEvent, context: EventContext) -> None:
            seen.append((event.key, int(event.size or 0), context.offset))

        await run_until(
            app,
            lambda: sum(app.outcomes.values()) == len(records),
        )
        assert app.outcomes["handled"] == 8
        assert app.outcomes["duplicate"] == 1
        assert app.outcomes["dead_lettered"] == 1
        for key in ("k0", "k1"):
            sizes = [size for seen_key, size, _ in seen if seen_key == key]
            assert sizes == sorted(sizes) and len(sizes) == 4
        assert await dead_letters(bootstrap, topic, 1) == [b"{not json"]
        assert await committed(bootstrap, topic, group, 2) == len(records)

    run(scenario)


@pytest.mark.kafka
def test_redis_dedupe_store_from_the_extra(bootstrap: str, redis_url: str) -> None:
    """With `fileevents[redis]`: a second group run over the same events with the same
    store and group skips them all as duplicates once the first has recorded them."""
    import redis.asyncio as redis

    async def scenario() -> None:
        topic = await make_topic(bootstrap, partitions=1)
        items = [canonical("key", seq) for seq in range(1, 6)]
        await produce(bootstrap, topic, [(i.key, i.model_dump_json().encode()) for i in items])
        client = redis.Redis.from_url(redis_url)
        group = f"dist-{uuid.uuid4().hex[:8]}"
        handled: list[str] = []
        try:
            for round_ in range(2):
                app = FileEvents(
                    bootstrap_servers=bootstrap,
                    topic=topic,
                    group_id=group,
                    dedupe=RedisDedupeStore(client),
                    handle_signals=False,
                    # the second round re-reads from the start under another consumer group
                    # name but the same dedupe ids: the same group id, offsets reset below
                    consumer_config={"auto_offset_reset": "earliest"},
                )

                @app.on("*")
                async def handle(event: FileEvent) -> None:
                    handled.append(event.id)

                await run_until(app, lambda app=app: sum(app.outcomes.values()) == len(items))
                if round_ == 0:
                    assert app.outcomes["handled"] == len(items)
                    # forget the commits, not the ids: the next round reads everything again
                    await reset_offsets(bootstrap, topic, group)
                else:
                    assert app.outcomes["duplicate"] == len(items)
            assert handled == [item.id for item in items]
        finally:
            await client.aclose()

    run(scenario)


async def reset_offsets(bootstrap: str, topic: str, group: str) -> None:
    """Commit offset 0 for `group` on `topic`'s one partition."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.commit({partition: 0})
    finally:
        await consumer.stop()


@pytest.mark.kafka
def test_cancelling_run_cancels_a_handler_and_is_no_failure(bootstrap: str) -> None:
    """Cancelled, run() cancels the handler that is running (it sees CancelledError), which
    is neither a failure nor done: on_error gets nothing and the offset stays uncommitted.
    Python 3.10 has no Task.cancelling(); this holds there too (processing.CLOSING)."""

    async def scenario() -> None:
        topic = await make_topic(bootstrap, partitions=1)
        item = canonical("key", 1)
        await produce(bootstrap, topic, [(item.key, item.model_dump_json().encode())])
        group = f"dist-{uuid.uuid4().hex[:8]}"
        started = asyncio.Event()
        cancelled: list[str] = []
        failures: list[Failure] = []
        app = FileEvents(
            bootstrap_servers=bootstrap,
            topic=topic,
            group_id=group,
            on_error=failures.append,
            handle_signals=False,
        )

        @app.on("*")
        async def hang(event: FileEvent) -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(event.id)
                raise

        task = asyncio.create_task(app.run())
        await asyncio.wait_for(started.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        assert cancelled == [item.id]
        assert failures == []
        assert app.outcomes["handled"] == 0
        assert await committed(bootstrap, topic, group, 1) == 0

    run(scenario)


@pytest.mark.kafka
def test_a_cancelled_error_a_handler_raises_is_a_failure(bootstrap: str) -> None:
    """A CancelledError that is not run()'s (the handler raised it) fails the event like any
    exception: on_error gets it, and with one attempt it is dead-lettered and committed."""

    async def scenario() -> None:
        topic = await make_topic(bootstrap, partitions=1)
        item = canonical("key", 1)
        await produce(bootstrap, topic, [(item.key, item.model_dump_json().encode())])
        group = f"dist-{uuid.uuid4().hex[:8]}"
        failures: list[Failure] = []
        app = FileEvents(
            bootstrap_servers=bootstrap,
            topic=topic,
            group_id=group,
            on_error=failures.append,
            retry=RetryPolicy(attempts=1),
            commit_interval=timedelta(milliseconds=100),
            handle_signals=False,
        )

        @app.on("*")
        async def raises(event: FileEvent) -> None:
            raise asyncio.CancelledError("not run()'s")

        await run_until(app, lambda: app.outcomes["dead_lettered"] == 1)
        assert [type(failure.error) for failure in failures] == [asyncio.CancelledError]
        assert failures[0].final
        assert await committed(bootstrap, topic, group, 1) == 1

    run(scenario)
