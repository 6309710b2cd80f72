"""The repartition topic is per app (`<app_id>.by-key`), so two apps on one cluster never read
each other's keyed records; a deployment of another app id that kept the default before
2026-12 (`storage-events.by-key`, every app's) keeps it while its emit group reads it, so
nothing waiting there is lost (streams.engine.topics.resolve_repartition_topic)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from support.kafka_io import committed, produce, raw, read_topic
from support.payloads import s3_body, s3_record
from support.worker import Topology, Worker

from dev.kafka.private import PrivateBroker
from streams.config import LEGACY_REPARTITION_TOPIC, Settings
from streams.core.records import RawRecord
from streams.core.routing import route
from streams.engine.topics import ensure_topics, topology
from streams.stages.normalize import route_policy

pytestmark = pytest.mark.kafka


def _config_without_repartition_topic(names: Topology) -> str:
    """The test's config as a deployment that kept the default writes it."""
    lines = names.config().splitlines()
    return "\n".join(line for line in lines if not line.startswith("repartition_topic")) + "\n"


def _topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def test_two_apps_that_keep_the_default_get_a_repartition_topic_each(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    worker = Worker(kafka_bootstrap, _config_without_repartition_topic(names), tmp_path)
    key = f"mine/{uuid.uuid4().hex[:8]}.txt"
    worker.start()
    try:
        asyncio.run(
            produce(
                kafka_bootstrap,
                names.raw,
                [raw(s3_body(s3_record(key, "0055AED6DCD90281E5")), "s3")],
            )
        )
        worker.wait_metric("storage_events_emitted_total", 1, instance="default")
    finally:
        assert worker.stop() == 0, worker.tail()
    own = f"{names.app_id}.by-key"
    assert own in _topics(kafka_bootstrap)
    assert asyncio.run(committed(kafka_bootstrap, f"{names.app_id}-emit", own))
    legacy = asyncio.run(
        committed(kafka_bootstrap, f"{names.app_id}-emit", LEGACY_REPARTITION_TOPIC)
    )
    assert legacy == {}
    output = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
    assert [record.json()["key"] for record in output] == [key]


@pytest.fixture(scope="module")
def private_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker of its own: the legacy topic's name is every default app's, and records left
    in it must not reach other tests' workers."""
    broker = PrivateBroker(tmp_path_factory.mktemp("legacy-repartition") / "kafka")
    bootstrap = broker.start(fresh=True)
    try:
        yield bootstrap
    finally:
        broker.stop()


def _commit_as_emit_group(bootstrap: str, group: str, partitions: int) -> None:
    """What the old worker's emit group left: committed offsets on the legacy topic."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    offsets = [TopicPartition(LEGACY_REPARTITION_TOPIC, p, 0) for p in range(partitions)]
    deadline = time.monotonic() + 60
    try:
        while True:
            try:  # a fresh broker's coordinator may not be loaded yet: NOT_COORDINATOR
                consumer.commit(offsets=offsets, asynchronous=False)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()


def test_an_app_still_on_the_shared_topic_keeps_it_and_loses_nothing_waiting_there(
    private_kafka: str, tmp_path: Path
) -> None:
    names = Topology()
    config = _config_without_repartition_topic(names)
    legacy_settings = Settings.model_validate(
        {
            **names.settings().model_dump(),
            "stream": {
                **names.settings().stream.model_dump(),
                "repartition_topic": LEGACY_REPARTITION_TOPIC,
            },
        }
    )
    waiting_key = f"waiting/{uuid.uuid4().hex[:8]}.txt"

    async def as_the_old_worker_left_it() -> None:
        await ensure_topics(private_kafka, topology(legacy_settings))
        # A keyed record stage one wrote before the upgrade, not yet read by stage two.
        delivery = RawRecord(
            names.raw, s3_body(s3_record(waiting_key, "0055AED6DCD90281E5")), {"source": b"s3"}
        )
        [keyed] = route(delivery, None, route_policy(legacy_settings)).records
        assert keyed.topic == LEGACY_REPARTITION_TOPIC
        await produce(
            private_kafka, keyed.topic, [(keyed.value or b"", list(keyed.headers))], keyed.key
        )

    asyncio.run(as_the_old_worker_left_it())
    _commit_as_emit_group(private_kafka, f"{names.app_id}-emit", 2)

    worker = Worker(private_kafka, config, tmp_path)
    fresh_key = f"fresh/{uuid.uuid4().hex[:8]}.txt"
    worker.start()
    try:
        body = s3_body(s3_record(fresh_key, "0055AED6DCD90281E5"))
        asyncio.run(produce(private_kafka, names.raw, [raw(body, "s3")]))
        worker.wait_metric("storage_events_emitted_total", 2, instance="default")
        log = worker.log_path.read_text(errors="replace")
    finally:
        assert worker.stop() == 0, worker.tail()
    assert f"reads {LEGACY_REPARTITION_TOPIC}" in log and "keeping it" in log
    assert f"{names.app_id}.by-key" not in _topics(private_kafka)
    output = asyncio.run(read_topic(private_kafka, names.output("default")))
    assert sorted(record.json()["key"] for record in output) == sorted([waiting_key, fresh_key])
