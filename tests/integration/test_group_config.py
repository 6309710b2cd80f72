"""The stage groups' KIP-848 timing (streams.engine.librdkafka.group_config) on the real broker:
a worker sets its groups' session timeout and heartbeat from `stream.session_timeout_s`, and
a value the broker's bounds refuse is reported naming the broker setting to change; a cluster
without KIP-848 (no ConsumerGroupHeartbeat in a broker's ApiVersions) is refused at start,
naming STREAMS_GROUP_PROTOCOL."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from support.worker import Topology, Worker

from streams.engine.librdkafka.group_config import (
    CONSUMER_GROUP_HEARTBEAT,
    api_keys_by_broker,
    configure,
    kip848_refusal,
    wanted,
)
from streams.kafka_settings import KafkaSettings

pytestmark = pytest.mark.kafka


def group_configs(bootstrap: str, group: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.GROUP, group)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    return {name: entry.value for name, entry in configs.items()}


def test_the_heartbeat_is_a_fifth_of_a_short_session_and_a_second_otherwise() -> None:
    assert wanted(6.0) == {
        "consumer.session.timeout.ms": "6000",
        "consumer.heartbeat.interval.ms": "1000",
    }
    assert wanted(3.0)["consumer.heartbeat.interval.ms"] == "600"


def test_a_worker_sets_its_stage_groups_session_timeout_and_heartbeat(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    config = names.config(extra="session_timeout_s = 12")
    worker = Worker(kafka_bootstrap, config, tmp_path, env={"STREAMS_ENGINE": "librdkafka"})
    worker.start()
    try:
        for stage in ("normalize", "emit"):
            configs = group_configs(kafka_bootstrap, f"{names.app_id}-{stage}")
            assert configs["consumer.session.timeout.ms"] == "12000", configs
            assert configs["consumer.heartbeat.interval.ms"] == "1000", configs
    finally:
        assert worker.stop() == 0, worker.tail()
    assert "KIP-848 group config" not in worker.log_path.read_text(errors="replace")


def test_a_value_below_the_brokers_bound_is_refused_naming_the_broker_setting(
    kafka_bootstrap: str,
) -> None:
    group = f"bounds-{uuid.uuid4().hex[:8]}"
    # 3 s: a 600 ms heartbeat, below the local broker's 1 s floor (Kafka's own: 5 s); the
    # session timeout, below its 6 s floor, too.
    refusals = configure(KafkaSettings.of(kafka_bootstrap), [group], 3.0)
    assert len(refusals) == 2, refusals
    assert "group.consumer.min.session.timeout.ms" in refusals[0], refusals
    assert "group.consumer.min.heartbeat.interval.ms" in refusals[1], refusals
    assert all(f"group {group}:" in refusal for refusal in refusals)
    configs = group_configs(kafka_bootstrap, group)
    assert configs["consumer.heartbeat.interval.ms"] != "600"  # the group kept the broker's


def test_a_cluster_without_kip848_is_refused_naming_the_setting(kafka_bootstrap: str) -> None:
    """The real broker's ApiVersions offer ConsumerGroupHeartbeat (Kafka 4.4): no refusal. The
    same answer without it (a broker before 4.0) is refused, naming the broker and the setting."""
    keys = asyncio.run(api_keys_by_broker(KafkaSettings.of(kafka_bootstrap)))
    assert keys and all({0, 1, 3, CONSUMER_GROUP_HEARTBEAT} <= offered for offered in keys.values())
    assert kip848_refusal(keys) is None
    broker = sorted(keys)[0]
    older = {**keys, broker: keys[broker] - {CONSUMER_GROUP_HEARTBEAT}}
    refusal = kip848_refusal(older)
    assert refusal is not None
    assert broker in refusal and "STREAMS_GROUP_PROTOCOL=classic" in refusal
