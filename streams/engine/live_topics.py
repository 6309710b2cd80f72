"""The stream's topics as Kafka has them, beside the plan (`python -m streams topics`).

The plan (streams.engine.topics.topology) is what the worker would create; a topic created
beforehand, by an older version or on a cluster with other defaults can differ (the 3-node
cluster's topics with 3 replicas, a plan saying 1). `differences` says how, per topic; it is
pure, `read_live` is the one metadata and config read behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streams.engine.topics import TopicSpec
from streams.kafka_settings import KafkaSettings


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


async def read_live(kafka: KafkaSettings, specs: list[TopicSpec]) -> dict[str, LiveTopic]:
    """The planned topics that exist, as Kafka has them (one metadata request for every
    topic, which never creates one, and one config request)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(
        **kafka.aiokafka_args(), client_id="storage-events-topics", request_timeout_ms=10_000
    )
    await admin.start()
    try:
        planned = {spec.name: spec for spec in specs}
        described = {
            topic["topic"]: topic["partitions"]
            for topic in await admin.describe_topics(None)
            if not topic["error_code"] and topic["topic"] in planned
        }
        configs: dict[str, dict[str, str]] = {name: {} for name in described}
        resources = [
            ConfigResource(
                ConfigResourceType.TOPIC, name, configs=dict.fromkeys(planned[name].config)
            )
            for name in described
            if planned[name].config
        ]
        if resources:
            for response in await admin.describe_configs(resources):
                for _, _, _, name, entries in response.resources:
                    configs.setdefault(name, {}).update(
                        {entry[0]: entry[1] for entry in entries if entry[1] is not None}
                    )
    finally:
        await admin.close()
    return {
        name: LiveTopic(
            len(partitions),
            min((len(partition.get("replicas") or []) for partition in partitions), default=0),
            configs.get(name, {}),
        )
        for name, partitions in described.items()
    }
