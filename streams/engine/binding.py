"""Which Kafka cluster and which changelog topics a worker's local state was written from.

Local RocksDB state is only a cache of the changelog topics: it is right only against the
cluster and the very topics it was restored from. A state directory kept across brokers (a new
local broker after an earlier `make run`, a volume moved to another cluster) or across a
deletion and re-creation of the changelog topics under the same names would otherwise be
trusted: its stored offsets lie past the new changelog's end, so nothing is restored and old
ids count as duplicates. `Binding` records the cluster id and the changelog topics' topic ids
next to the state (`binding.json`); the store compares it with the cluster's at every restore.

The cluster id and the topic ids (KIP-516) come from confluent-kafka's AdminClient
(`describe_cluster`, `describe_topics`). A cluster that gives no topic id for a topic (the
zero id) leaves it None: the binding then holds the cluster id only for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from streams.engine.librdkafka import librdkafka_log
from streams.kafka_settings import KafkaSettings

BINDING_FILE = "binding.json"
UNKNOWN_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
"""The zero id: what Kafka answers for a topic it has no id for."""
TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Binding:
    """A cluster id and, per changelog topic, its topic id (None: the broker did not say)."""

    cluster_id: str
    topic_ids: Mapping[str, str | None] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {"cluster_id": self.cluster_id, "topic_ids": dict(self.topic_ids)},
            indent=2,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Binding:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("cluster_id"), str):
            raise ValueError("no cluster_id")
        topic_ids = data.get("topic_ids") or {}
        if not isinstance(topic_ids, dict):
            raise ValueError("topic_ids is not an object")
        return cls(
            data["cluster_id"],
            {
                str(topic): None if value is None else str(value)
                for topic, value in topic_ids.items()
            },
        )


def mismatch(stored: Binding | None, current: Binding, has_state: bool) -> str | None:
    """Why local state recorded as `stored` must not be used against `current`; None if it
    may. State without any record of its origin is not trusted either (written before state
    was bound, or the record was lost). A topic id either side does not know is not compared."""
    if stored is None:
        return "it records no cluster it came from" if has_state else None
    if stored.cluster_id != current.cluster_id:
        return (
            f"it was written against Kafka cluster {stored.cluster_id}, "
            f"the brokers now are cluster {current.cluster_id}"
        )
    for topic, topic_id in sorted(current.topic_ids.items()):
        was = stored.topic_ids.get(topic)
        if topic_id is not None and was is not None and was != topic_id:
            return (
                f"changelog topic {topic} was deleted and created again "
                f"(topic id {was}, now {topic_id})"
            )
    return None


def read_binding(directory: Path) -> Binding | None:
    """The binding recorded in `directory`, or None (none recorded, or unreadable)."""
    try:
        return Binding.from_json((directory / BINDING_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None


def write_binding(directory: Path, binding: Binding) -> None:
    """Record `binding` atomically: a crash leaves the old record or the new one."""
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory / f".{BINDING_FILE}.tmp"
    staging.write_text(binding.to_json() + "\n")
    staging.replace(directory / BINDING_FILE)


def fetch_binding(kafka: KafkaSettings | str, topics: Iterable[str]) -> Binding:
    """The cluster id and the topic ids of `topics`, from the cluster (blocking: a thread's).

    A topic the cluster does not have raises KafkaException (UNKNOWN_TOPIC_OR_PART): there is
    no changelog to bind to, and the caller retries."""
    topics = sorted(topics)
    config: dict[str, Any] = {
        **KafkaSettings.of(kafka).librdkafka_config(),
        "client.id": "storage-events-binding",
        "logger": librdkafka_log(),  # its lines through the log, never raw on stderr
    }
    admin = AdminClient(config)
    cluster = admin.describe_cluster(request_timeout=TIMEOUT_S).result(TIMEOUT_S + 5)
    described = admin.describe_topics(TopicCollection(topics), request_timeout=TIMEOUT_S)
    found: dict[str, str | None] = {}
    for name, future in described.items():
        topic_id = str(future.result(TIMEOUT_S + 5).topic_id)
        found[name] = None if topic_id == UNKNOWN_TOPIC_ID else topic_id
    missing = [topic for topic in topics if topic not in found]
    if missing:
        error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"changelog topics {missing}")
        raise KafkaException(error)
    return Binding(str(cluster.cluster_id), found)
