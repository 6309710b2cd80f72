"""The stage groups' KIP-848 timing (streams.engine.librdkafka.group_config) on the real broker:
a worker sets its groups' session timeout and heartbeat from `stream.session_timeout_s`, and
a value the broker's bounds refuse is reported naming the broker setting to change; a cluster
without KIP-848 (no ConsumerGroupHeartbeat in a broker's ApiVersions) is refused at start,
naming STREAMS_GROUP_PROTOCOL, and so is a 4.x cluster with KIP-848 groups switched off (its
`group.version` feature at 0): the worker exits 2 with one line naming the setting."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from support.worker import Topology, Worker

from dev.kafka.private import PrivateBroker
from streams.engine.librdkafka.group_config import (
    CONSUMER_GROUP_HEARTBEAT,
    GROUP_VERSION,
    BrokerVersions,
    configure,
    kip848_refusal,
    versions_by_broker,
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
    """The real broker's ApiVersions offer ConsumerGroupHeartbeat (Kafka 4.4) with
    group.version finalized: no refusal. The same answer without the API (a broker before
    4.0) is refused, naming the broker and the setting."""
    versions = asyncio.run(versions_by_broker(KafkaSettings.of(kafka_bootstrap)))
    assert versions
    for seen in versions.values():
        assert {0, 1, 3, CONSUMER_GROUP_HEARTBEAT} <= seen.api_keys
        assert seen.features is not None and seen.features[GROUP_VERSION] >= 1, seen
        assert seen.features["metadata.version"] > 0, seen  # the tagged field read in full
    assert kip848_refusal(versions) is None
    broker = sorted(versions)[0]
    without = versions[broker].api_keys - {CONSUMER_GROUP_HEARTBEAT}
    older = {**versions, broker: BrokerVersions(without)}
    refusal = kip848_refusal(older)
    assert refusal is not None
    assert broker in refusal and "STREAMS_GROUP_PROTOCOL=classic" in refusal


@pytest.fixture(scope="module")
def groups_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private Kafka 4.4 broker whose `group.version` feature is at 0, as a cluster upgraded
    from 3.x keeps it until an operator upgrades the feature."""
    broker = PrivateBroker(tmp_path_factory.mktemp("groups-off") / "kafka")
    bootstrap = broker.start(fresh=True)
    try:
        done = broker.run("admin", given=f"feature {GROUP_VERSION} 0\n")
        assert f"feature {GROUP_VERSION}=0" in done, done
        yield bootstrap
    finally:
        broker.stop()


def test_a_worker_on_a_cluster_with_kip848_switched_off_stops_naming_the_setting(
    groups_off: str, tmp_path: Path
) -> None:
    """Its brokers still offer ConsumerGroupHeartbeat but answer it UNSUPPORTED_VERSION, which
    librdkafka raises as a fatal error at every join: without the start-up check the worker
    would rejoin for good and never be assigned anything."""
    versions = asyncio.run(versions_by_broker(KafkaSettings.of(groups_off)))
    [seen] = versions.values()
    assert CONSUMER_GROUP_HEARTBEAT in seen.api_keys and seen.features is not None
    assert GROUP_VERSION not in seen.features, seen.features
    worker = Worker(groups_off, Topology().config(), tmp_path, env={"STREAMS_ENGINE": "librdkafka"})
    worker.start(wait_ready=False)
    assert worker.process is not None
    try:
        code = worker.process.wait(120)
    finally:
        worker.kill()
    log = worker.log_path.read_text(errors="replace")
    assert code == 2, worker.tail()
    [line] = [text for text in log.splitlines() if text.startswith("storage-events:")]
    assert "STREAMS_GROUP_PROTOCOL=classic" in line and GROUP_VERSION in line, line
    assert f"upgrade --feature {GROUP_VERSION}=1" in line, line


def test_the_classic_protocol_runs_on_a_cluster_with_kip848_switched_off(
    groups_off: str, tmp_path: Path
) -> None:
    """The setting the refusal names works: the same cluster, STREAMS_GROUP_PROTOCOL=classic,
    the worker is ready and stops cleanly."""
    worker = Worker(
        groups_off,
        Topology().config(),
        tmp_path,
        env={"STREAMS_ENGINE": "librdkafka", "STREAMS_GROUP_PROTOCOL": "classic"},
    )
    worker.start(timeout_s=120)
    assert worker.stop() == 0, worker.tail()
