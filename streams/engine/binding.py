"""Which Kafka cluster and which changelog topics a worker's local state was written from.

Local RocksDB state is only a cache of the changelog topics: it is right only against the
cluster and the very topics it was restored from. A state directory kept across brokers (a new
local broker after an earlier `make run`, a volume moved to another cluster) or across a
deletion and re-creation of the changelog topics under the same names would otherwise be
trusted: its stored offsets lie past the new changelog's end, so nothing is restored and old
ids count as duplicates. `Binding` records the cluster id and the changelog topics' topic ids
next to the state (`binding.json`); the store compares it with the cluster's at every restore.

Topic ids (KIP-516) come from a Metadata v12 request (responses carry topic ids from v10;
MetadataRequest.json of the Kafka clients: "Version 12 supports topic Id"; Kafka 4.4 answers
v0-v13):
aiokafka 0.14 speaks Metadata up to v5, which has the cluster id but no topic ids, and its
admin client has no DescribeTopics with ids, so the request and its response are declared here
in aiokafka's own protocol types. A broker that cannot answer v12 gives no topic ids; the
binding then holds the cluster id only (the one thing v5 gives that changes with the cluster),
and the log says so.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

BINDING_FILE = "binding.json"
UNKNOWN_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
"""The zero id: what Metadata answers for a topic it has no id for."""


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


class _Uuid:
    """Kafka's `uuid` type (16 bytes; aiokafka has none), as Kafka prints it: URL-safe
    base64 without padding, as `kafka-topics.sh --describe` shows a TopicId."""

    @classmethod
    def encode(cls, value: str) -> bytes:
        return base64.urlsafe_b64decode(value + "==")

    @classmethod
    def decode(cls, data: BytesIO) -> str:
        raw = data.read(16)
        if len(raw) != 16:
            raise ValueError("Buffer underrun decoding uuid")
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def repr(cls, value: Any) -> str:
        return repr(value)


class MetadataResponse_v12(Response):  # type: ignore[misc]  # aiokafka is untyped here
    """Metadata v12 (flexible): MetadataResponse.json of the Kafka clients, fields of v12."""

    API_KEY = 3
    API_VERSION = 12
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", CompactString("utf-8")),
                ("topic_id", _Uuid),  # duck-typed like aiokafka's own types
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class MetadataRequest_v12(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 12
    RESPONSE_TYPE = MetadataResponse_v12
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(
                ("topic_id", _Uuid),
                ("name", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("allow_auto_topic_creation", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class TopicIdsRequest(Request[MetadataRequest_v12]):  # type: ignore[misc]
    """Metadata of named topics with their ids; v12 only (see the module's docstring)."""

    API_KEY = 3

    def __init__(self, topics: Iterable[str]) -> None:
        self._topics = sorted(topics)

    def build(self, request_struct_class: type[MetadataRequest_v12]) -> MetadataRequest_v12:
        return request_struct_class(
            [(UNKNOWN_TOPIC_ID, topic, {}) for topic in self._topics], False, False, {}
        )


async def fetch_binding(client: AIOKafkaClient, topics: Iterable[str]) -> Binding:
    """The cluster id and the topic ids of `topics`, from a started client's cluster.

    A topic the cluster does not have raises its Kafka error (UnknownTopicOrPartitionError):
    there is no changelog to bind to, and the caller retries. A broker without Metadata v12
    gives the cluster id (Metadata v2+) and no topic ids."""
    topics = sorted(topics)
    node_id = client.get_random_node()
    try:
        response = await client.send(node_id, TopicIdsRequest(topics))
    except NotImplementedError:  # aiokafka: the broker has no version this request knows
        older = await client.send(node_id, MetadataRequest(topics, False))
        return Binding(str(older.cluster_id), dict.fromkeys(topics))
    found: dict[str, str | None] = {}
    for error_code, name, topic_id, *_ in response.topics:
        if error_code:
            raise for_code(error_code)(f"changelog topic {name}")
        found[name] = None if topic_id == UNKNOWN_TOPIC_ID else topic_id
    missing = [topic for topic in topics if topic not in found]
    if missing:
        raise for_code(3)(f"changelog topics {', '.join(missing)}")
    return Binding(str(response.cluster_id), found)
