"""`make kafka KAFKA_BROKERS=3`: a three-broker KRaft cluster of the project's own, and the
worker's topics on it (replication factor 3, `min.insync.replicas` 2).

One cluster for the module (three JVMs on a shared 2-core machine), on free ports in the
test's own directory; stopped at the end."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from support.worker import Topology, Worker

from dev.kafka.private import LOCAL_KAFKA, PrivateCluster, free_port_run
from streams.config import load_settings
from streams.engine.topics import MIN_INSYNC_REPLICAS, topology

pytestmark = pytest.mark.kafka

DYNAMIC_TOPIC_CONFIG = 1
"""DescribeConfigs' config_source of a value set on the topic itself (not a broker default)"""


@dataclass(frozen=True)
class Started:
    cluster: PrivateCluster
    output: subprocess.CompletedProcess[str]
    """what `localkafka.py start --brokers 3` printed"""


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    cluster = PrivateCluster(tmp_path_factory.mktemp("cluster") / "kafka", brokers=3)
    try:
        yield Started(cluster, cluster.run("start"))
    finally:
        cluster.run("stop")


async def describe(bootstrap: str, topics: list[str]) -> tuple[Any, dict[str, Any]]:
    """(the cluster's brokers, {topic: (partitions, {config: (value, source)})})."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        brokers = (await admin.describe_cluster())["brokers"]
        described = {topic["topic"]: topic for topic in await admin.describe_topics(topics)}
        answers = await admin.describe_configs(
            [
                ConfigResource(ConfigResourceType.TOPIC, name, configs={MIN_INSYNC_REPLICAS: None})
                for name in topics
            ]
        )
        configs = {
            name: {entry[0]: (entry[1], entry[3]) for entry in entries}
            for answer in answers
            for _, _, _, name, entries in answer.resources
        }
        return brokers, {
            name: (described[name]["partitions"], configs.get(name, {})) for name in topics
        }
    finally:
        await admin.close()


def test_three_brokers_come_up_and_the_bootstrap_of_all_three_is_printed_last(
    started: Started,
) -> None:
    cluster = started.cluster
    expected = ",".join(f"127.0.0.1:{port}" for port in cluster.client_ports)
    assert started.output.stdout.strip().splitlines()[-1] == expected
    assert "3 KRaft controllers (combined mode" in started.output.stderr
    assert len(set(cluster.client_ports)) == 3
    assert cluster.client_ports == [cluster.port, cluster.port + 1, cluster.port + 2]
    brokers, _ = asyncio.run(describe(cluster.bootstrap, []))
    assert sorted(broker["node_id"] for broker in brokers) == [1, 2, 3]
    assert sorted(broker["port"] for broker in brokers) == cluster.client_ports

    again = cluster.run("start")
    assert again.stdout.strip().splitlines()[-1] == expected
    assert "already running" in again.stderr
    status = cluster.run("status").stdout
    assert status.count("running (pid") == 3, status


def test_the_worker_creates_its_topics_with_three_replicas_and_two_in_sync(
    started: Started, tmp_path: Path
) -> None:
    cluster = started.cluster
    names = Topology()
    config = names.config(extra="replication_factor = 3\nmin_insync_replicas = 2")
    worker = Worker(cluster.bootstrap, config, tmp_path / "worker").start(timeout_s=180)
    try:
        specs = topology(load_settings(worker.config_path, environ={}))
        leader = f"{names.app_id}-__assignor-__leader"
        topics = [spec.name for spec in specs]
        _, found = asyncio.run(describe(cluster.bootstrap, [*topics, leader]))
    finally:
        worker.stop()
    roles = {spec.role for spec in specs}
    assert {"raw", "repartition", "changelog", "dead-letter", "output", "stale"} <= roles
    for name in [*topics, leader]:
        partitions, _ = found[name]
        assert partitions, f"{name} was not created"
        for partition in partitions:
            assert len(partition["replicas"]) == 3, (name, partition)
    for name in topics:
        value, source = found[name][1][MIN_INSYNC_REPLICAS]
        assert (value, source) == ("2", DYNAMIC_TOPIC_CONFIG), name


def run_localkafka(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LOCAL_KAFKA), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_cluster_port_in_use_is_one_line_naming_the_port(tmp_path: Path) -> None:
    port = free_port_run(6)
    env = {**os.environ, "LOCAL_KAFKA_DIR": str(tmp_path / "kafka"), "LOCAL_KAFKA_PORT": str(port)}
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port + 4))  # node 2's controller
        squatter.listen()
        result = run_localkafka(env, "start", "--brokers", "3")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"port {port + 4}" in lines[0] and "node 2" in lines[0]
    assert "LOCAL_KAFKA_PORT" in lines[0]


@pytest.mark.parametrize("brokers", ["0", "10", "three"])
def test_a_wrong_cluster_size_is_one_line_naming_the_setting(tmp_path: Path, brokers: str) -> None:
    env = {**os.environ, "LOCAL_KAFKA_DIR": str(tmp_path / "kafka"), "LOCAL_KAFKA_BROKERS": brokers}
    result = run_localkafka(env, "start")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"localkafka: --brokers / LOCAL_KAFKA_BROKERS must be 1 to 9, got {brokers!r}"
    ]
