"""The state restore on confluent-kafka (issue 32, item 5): what it reads of a changelog
written in transactions, and where it stops.

The restore reads `read_committed` to the last stable offset: a transaction that was aborted
never becomes state, one still open is neither waited for nor read, and a changelog that
ends with a commit marker (no record at the end offset) is finished, not waited on.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from streams.engine.store import RESTORE_GROUP, StateStore, restore_config, restore_group

pytestmark = pytest.mark.kafka

RESTORE_LIMIT_S = 60.0
"""A restore that takes longer waits for something it must not wait for."""


@pytest.fixture
def changelog(kafka_bootstrap: str) -> Iterator[str]:
    """A fresh one-partition `seen` changelog topic, deleted afterwards."""
    topic = f"restore-{uuid.uuid4().hex[:10]}-seen-changelog"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    yield topic
    admin.delete_topics([topic])[topic].result(30)


def transactional(bootstrap: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"restore-test-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    return producer


def write(producer: Producer, topic: str, items: dict[bytes, bytes], commit: bool | None) -> None:
    """`items` in one transaction: committed (True), aborted (False) or left open (None)."""
    producer.begin_transaction()
    for key, value in items.items():
        producer.produce(topic, value, key, partition=0)
    producer.flush(30)
    if commit is True:
        producer.commit_transaction(30)
    elif commit is False:
        producer.abort_transaction(30)


def restore(store: StateStore, bootstrap: str) -> int:
    restored = asyncio.run(asyncio.wait_for(store.restore(bootstrap, [0], {}), RESTORE_LIMIT_S))
    return restored.records


def state(store: StateStore) -> dict[bytes, bytes]:
    return dict(store.entries("seen", 0, 1_000))


def test_only_committed_transactions_become_state_and_a_trailing_commit_marker_ends_it(
    kafka_bootstrap: str, changelog: str, tmp_path: Path
) -> None:
    producer = transactional(kafka_bootstrap)
    write(producer, changelog, {b"a": b"1", b"b": b"2"}, commit=True)
    write(producer, changelog, {b"c": b"aborted", b"a": b"aborted"}, commit=False)
    write(producer, changelog, {b"d": b"4"}, commit=True)  # the log ends with its marker

    store = StateStore(tmp_path, {"seen": changelog})
    assert restore(store, kafka_bootstrap) == 3
    assert state(store) == {b"a": b"1", b"b": b"2", b"d": b"4"}
    # offsets: a 0, b 1, marker 2, c 3, a 4, marker 5, d 6, marker 7
    assert store.changelog_offset("seen", 0) == 6
    assert restore(store, kafka_bootstrap) == 0  # nothing past the stored offset
    store.close()


def test_an_open_transaction_is_neither_waited_for_nor_read(
    kafka_bootstrap: str, changelog: str, tmp_path: Path
) -> None:
    producer = transactional(kafka_bootstrap)
    write(producer, changelog, {b"a": b"1"}, commit=True)
    write(producer, changelog, {b"b": b"open"}, commit=None)

    store = StateStore(tmp_path, {"seen": changelog})
    assert restore(store, kafka_bootstrap) == 1
    assert state(store) == {b"a": b"1"}

    producer.commit_transaction(30)
    assert restore(store, kafka_bootstrap) == 1  # from where the first restore stopped
    assert state(store) == {b"a": b"1", b"b": b"open"}
    store.close()


def test_the_restore_names_the_apps_own_group() -> None:
    """librdkafka looks the consumer's group.id up (FindCoordinator: Describe on the group),
    so the restore names the group the worker's ACLs grant it, its app's."""
    assert restore_group({"seen": "my-app-seen-changelog", "keys": "my-app-keys-changelog"}) == (
        "my-app"
    )
    assert restore_group({"seen": "elsewhere"}) == RESTORE_GROUP


def test_a_restore_cancelled_midway_leaves_its_offsets_and_the_next_one_reads_the_rest(
    kafka_bootstrap: str, changelog: str, tmp_path: Path
) -> None:
    """The restore's batches are consumed and written in a thread: cancelling it waits for
    the call in flight (the consumer is closed once no call is on it, the database written
    with the offset its batch reached), and the next restore reads from there."""
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "linger.ms": 50,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    count = 200_000
    for index in range(count):
        producer.produce(changelog, b"v%d" % index, b"k%d" % index, partition=0)
        if index % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    store = StateStore(tmp_path, {"seen": changelog})

    def written() -> int | None:
        """The offset the store recorded; None until the restore opened its database."""
        with contextlib.suppress(KeyError):
            return store.changelog_offset("seen", 0)
        return None

    async def cancel_midway() -> None:
        task = asyncio.ensure_future(store.restore(kafka_bootstrap, [0], {}))
        async with asyncio.timeout(RESTORE_LIMIT_S):
            while not task.done() and written() is None:
                await asyncio.sleep(0.001)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    reached = store.changelog_offset("seen", 0)
    assert reached is not None
    assert restore(store, kafka_bootstrap) == count - 1 - reached
    assert store.changelog_offset("seen", 0) == count - 1
    assert len(store.entries("seen", 0, count + 1)) == count
    store.close()


def test_the_restore_fetches_a_drained_partition_again_at_once() -> None:
    """librdkafka postpones a partition's next fetch by fetch.queue.backoff.ms (1 s by
    default) once its queue holds queued.min.messages; the restore drains that in a fraction
    of it, and sat idle (runs of empty consumes in the worker) without a short backoff."""
    assert restore_config("localhost:9092", "app")["fetch.queue.backoff.ms"] <= 50
