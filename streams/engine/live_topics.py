"""The stream's topics as Kafka has them, beside the plan (`python -m streams topics`).

The plan (streams.engine.topics.topology) is what the worker would create; a topic created
beforehand, by an older version or on a cluster with other defaults can differ (the 3-node
cluster's topics with 3 replicas, a plan saying 1). `differences` says how, per topic; it is
pure, `read_live` is the one metadata and config read behind it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from streams.engine.topics import TopicSpec
from streams.kafka_settings import KafkaSettings

REQUEST_TIMEOUT_S = 10.0
"""One metadata or config request answered within this."""


@dataclass(frozen=True)
class LiveTopic:
    """One topic as Kafka describes it."""

    partitions: int
    replication_factor: int
    """The least number of replicas over its partitions."""
    config: dict[str, str] = field(default_factory=dict)
    """Its values of the settings the plan names."""

    def as_json(self) -> dict[str, Any]:
        return {
            "partitions": self.partitions,
            "replication_factor": self.replication_factor,
            "config": self.config,
        }


def differences(spec: TopicSpec, live: LiveTopic | None) -> list[str]:
    """How the live topic differs from its plan, one phrase each (empty: as planned)."""
    if live is None:
        return ["missing: `python -m streams create-topics` (or the worker) creates it"]
    found = []
    if live.partitions != spec.partitions:
        found.append(f"partitions {live.partitions}, the plan {spec.partitions}")
    if live.replication_factor != spec.replication_factor:
        found.append(
            f"replication_factor {live.replication_factor}, the plan {spec.replication_factor}"
        )
    for name, planned in sorted(spec.config.items()):
        value = live.config.get(name)
        if value is not None and value != planned:
            found.append(f"{name}={value}, the plan {planned}")
    return found


def _read_live(kafka: KafkaSettings, specs: list[TopicSpec]) -> dict[str, LiveTopic]:
    """`read_live`'s requests (blocking: a thread's)."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._config import ConfigResource
    from confluent_kafka.admin._resource import ResourceType

    from streams.engine.librdkafka import librdkafka_log

    config: dict[str, Any] = {
        **kafka.librdkafka_config(),
        "client.id": "storage-events-topics",
        "logger": librdkafka_log(),  # its lines through the log, never raw on stderr
    }
    admin = AdminClient(config)
    planned = {spec.name: spec for spec in specs}
    metadata = admin.list_topics(timeout=REQUEST_TIMEOUT_S)
    described = {
        name: topic
        for name, topic in metadata.topics.items()
        if topic.error is None and name in planned
    }
    configs: dict[str, dict[str, str]] = {name: {} for name in described}
    resources = [
        ConfigResource(ResourceType.TOPIC, name) for name in described if planned[name].config
    ]
    if resources:
        futures = admin.describe_configs(resources, request_timeout=REQUEST_TIMEOUT_S)
        for resource, future in futures.items():
            wanted = planned[resource.name].config
            configs[resource.name].update(
                {
                    name: entry.value
                    for name, entry in future.result(REQUEST_TIMEOUT_S + 5).items()
                    if name in wanted and entry.value is not None
                }
            )
    return {
        name: LiveTopic(
            len(topic.partitions),
            min((len(partition.replicas) for partition in topic.partitions.values()), default=0),
            configs.get(name, {}),
        )
        for name, topic in described.items()
    }


async def read_live(kafka: KafkaSettings, specs: list[TopicSpec]) -> dict[str, LiveTopic]:
    """The planned topics that exist, as Kafka has them (one metadata request for every
    topic, which never creates one, and one config request), in a thread: confluent-kafka's
    calls block."""
    return await asyncio.to_thread(_read_live, kafka, specs)
