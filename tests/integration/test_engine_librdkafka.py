"""The librdkafka engine (STREAMS_ENGINE=librdkafka, streams.engine) on the real broker:
end-to-end emit, a partition moving to a second worker incrementally while the first keeps
emitting its other partitions, and a fenced transactional producer survived."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support.feed import Feed
from support.kafka_io import produce, raw, read_topic
from support.payloads import s3_body, s3_record
from support.worker import Topology, Worker, wait_for

from streams.core.partitioning import partition_for
from streams.core.records import partition_key

pytestmark = pytest.mark.kafka

ENGINE = {"STREAMS_ENGINE": "librdkafka"}
PARTITIONS = 4


def _delivery(key: str, sequencer: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    return raw(s3_body(s3_record(key, f"{sequencer:016X}")), "s3")


def _config(names: Topology) -> str:
    return names.config().replace("partitions = 2", f"partitions = {PARTITIONS}")


def _keys(records: list) -> list[str]:  # type: ignore[type-arg]
    return sorted(record.json()["key"] for record in records)


def _log(worker: Worker) -> str:
    return worker.log_path.read_text(errors="replace")


def test_the_librdkafka_engine_emits_once_and_never_retries_not_enough_replicas(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    worker = Worker(kafka_bootstrap, _config(names), tmp_path, env=ENGINE).start()
    try:
        deliveries = [_delivery(f"e2e/{n}.txt", n + 1) for n in range(20)]
        asyncio.run(produce(kafka_bootstrap, names.raw, deliveries + deliveries[:5]))
        worker.wait_metric("storage_events_emitted_total", 20, instance="default")
        worker.wait_metric("storage_events_duplicates_total", 5, instance="default")
        records = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
    finally:
        assert worker.stop() == 0, worker.tail()
    assert _keys(records) == sorted(f"e2e/{n}.txt" for n in range(20))
    log = _log(worker)
    assert "emit: assigned" in log  # the engine's member, not aiokafka's
    assert not re.search(r"NotEnoughReplicas|NOT_ENOUGH_REPLICAS", log, re.IGNORECASE)


def _by_key_partition(key: str) -> int:
    return partition_for(partition_key("default", "uploads", key), PARTITIONS)


def _output_times(bootstrap: str, topic: str) -> list[tuple[float, int, str]]:
    """(create time, by-key partition, key) of every output record."""
    import json

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        parts = [TopicPartition(topic, p, 0) for p in metadata.topics[topic].partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in parts}
        consumer.assign(parts)
        found: list[tuple[float, int, str]] = []
        idle = 0
        # Up to the end offsets; a transaction's commit marker is the last offset, which
        # read_committed never returns: three idle rounds once nothing comes any more.
        while idle < 3:
            messages = [message for message in consumer.consume(500, 1.0) if not message.error()]
            idle = 0 if messages else idle + 1
            for message in messages:
                key = json.loads(message.value())["key"]
                found.append((message.timestamp()[1] / 1000, _by_key_partition(key), key))
        assert sum(ends.values()) >= len(found)
        return found
    finally:
        consumer.close()


def _logged_at(line: str) -> float:
    stamp = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]", line)
    assert stamp is not None, line
    return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_a_partition_moves_to_a_second_worker_while_the_first_keeps_emitting_the_others(
    kafka_bootstrap: str, tmp_path: Path, protocol: str
) -> None:
    """KIP-848 (the default), and the classic protocol with the cooperative-sticky assignor."""
    names = Topology()
    config = _config(names)
    env = {**ENGINE, "STREAMS_GROUP_PROTOCOL": protocol}
    first = Worker(
        kafka_bootstrap, config, tmp_path / "a", env={**env, "STREAMS_GROUP_INSTANCE_ID": "a"}
    ).start()
    second = Worker(
        kafka_bootstrap, config, tmp_path / "b", env={**env, "STREAMS_GROUP_INSTANCE_ID": "b"}
    )
    feed = Feed(kafka_bootstrap, names.raw, "feed")
    try:
        feed.start()
        first.wait_metric("storage_events_emitted_total", 40, instance="default")
        second.start()
        wait_for(lambda: "emit: revoked" in _log(first), 60, "the first worker to give some up")
        second.wait_metric("storage_events_emitted_total", 20, instance="default")
        feed.stopped.set()
        feed.join()
        sent = len(feed.sent)
        wait_for(
            lambda: (
                first.metric("storage_events_emitted_total", instance="default")
                + second.metric("storage_events_emitted_total", instance="default")
                >= sent
            ),
            60,
            f"all {sent} deliveries emitted",
        )
        assert first.process is not None and first.process.poll() is None, first.tail()
    finally:
        feed.stopped.set()
        codes = (second.stop(), first.stop())
    assert codes == (0, 0), first.tail() + second.tail()

    log = _log(first)
    revoke = next(line for line in log.splitlines() if "emit: revoked" in line)
    kept = int(re.search(r"keeps (\d+) partitions", revoke).group(1))  # type: ignore[union-attr]
    moved = {int(n) for n in re.findall(r"by-key\[(\d+)\]", revoke)}
    # Incremental: the first worker gave up only what moved, and kept the rest.
    assert moved and kept == PARTITIONS - len(moved), revoke
    running = log.split("Signal received: 15", 1)[0]  # before the first is stopped itself
    assert "keeps 0 partitions" not in running, running[-3000:]
    revoked_at = _logged_at(revoke)

    outputs = _output_times(kafka_bootstrap, names.output("default"))
    keys = [key for _, _, key in outputs]
    assert sorted(keys) == sorted(feed.sent)  # nothing lost, nothing twice
    kept_partitions = set(range(PARTITIONS)) - moved
    during_join = [
        (at, partition)
        for at, partition, _ in outputs
        if partition in kept_partitions and revoked_at - 1.0 <= at <= revoked_at + 1.0
    ]
    # The partitions that kept their owner went on emitting while the others moved.
    assert during_join, (revoked_at, sorted(outputs)[:5])


def test_a_fenced_transactional_producer_is_survived(kafka_bootstrap: str, tmp_path: Path) -> None:
    names = Topology()
    worker = Worker(
        kafka_bootstrap,
        _config(names),
        tmp_path,
        env={**ENGINE, "STREAMS_GROUP_INSTANCE_ID": "fenced"},
    ).start()
    try:
        first = [_delivery(f"before/{n}.txt", n + 1) for n in range(10)]
        asyncio.run(produce(kafka_bootstrap, names.raw, first))
        worker.wait_metric("storage_events_emitted_total", 10, instance="default")
        # Another producer under the worker's transactional.id: the worker's is fenced.
        intruder = Producer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "transactional.id": f"{names.app_id}-emit-fenced",
            }
        )
        intruder.init_transactions(30)
        later = [_delivery(f"after/{n}.txt", n + 100) for n in range(10)]
        asyncio.run(produce(kafka_bootstrap, names.raw, later))
        worker.wait_metric("storage_events_emitted_total", 20, instance="default")
        assert worker.process is not None and worker.process.poll() is None, worker.tail()
        records = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
    finally:
        assert worker.stop() == 0, worker.tail()
    assert _keys(records) == sorted(
        [f"before/{n}.txt" for n in range(10)] + [f"after/{n}.txt" for n in range(10)]
    )
    log = _log(worker)
    assert "the group moved on" in log, log[-3000:]
    assert "stage failed" not in log
