"""An AsyncAPI 3.0 document of every topic the product reads and writes, from streams.engine.topics.

`python -m streams asyncapi [--config FILE]` prints the document of a configuration (the
same topics `create-topics` makes, with their partitions, replicas and topic configs as
Kafka channel bindings); `schemas/asyncapi.json` is the one of the default configuration,
and tests/unit/test_asyncapi.py holds that file to this generator and validates it against
the official AsyncAPI 3.0.0 JSON Schema (npm `@asyncapi/specs`).

Channels by role (`TopicSpec.role`): raw (bridges write, stage one reads), repartition
(stage one writes, stage two reads), output and stale per instance (stage two writes, your
consumers read), dead-letter (both stages write, `replay-dead-letters` reads), changelog
(the worker's state, internal: listed for their configs, their records are no contract).
The output payload is the canonical event's JSON Schema (streams.core.schema), embedded.
"""

from __future__ import annotations

import re
from typing import Any

from streams.config import Settings
from streams.core.records import (
    CE_SPECVERSION,
    CE_TYPE_PREFIX,
    EVENT_TYPES,
    INSTANCE_HEADER,
    RECEIVED_AT_HEADER,
)
from streams.core.schema import (
    FILE_EVENT_SCHEMA_PATH,
    FILE_EVENT_SCHEMA_URI,
    FILE_EVENT_SCHEMA_VERSION,
    file_event_schema,
)
from streams.engine.topics import TopicSpec, topology

ASYNCAPI_VERSION = "3.0.0"
KAFKA_BINDING_VERSION = "0.5.0"
SERVER = "kafka"
INTEGER_CONFIGS = re.compile(r"^\d+$")
"""Topic config values written as integers in the binding (the binding types them so)."""

STRING: dict[str, Any] = {"type": "string"}


def _header(description: str, **schema: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **schema}


RAW_HEADERS: dict[str, Any] = {
    "type": "object",
    "description": "Written by the bridges (connectors.publisher). Header values are UTF-8.",
    "properties": {
        "source": _header(
            "The normalizer that reads the value (s3, eventbridge, gcs, azure, minio, supabase,"
            " b2, box, cloudinary, appwrite, reconcile); absent only on raw topics with a "
            "default_source."
        ),
        "transport": _header("How the delivery came: webhook, sqs, pubsub-pull, ..."),
        "delivery-id": _header("The transport's id of the delivery, else a random one."),
        RECEIVED_AT_HEADER: _header("When the bridge received it: Unix seconds, decimal."),
    },
    "patternProperties": {
        r"^header\.": _header("An HTTP header of the delivery, name in lower case."),
        r"^attribute\.": _header("A Pub/Sub attribute of the delivery, name as sent."),
    },
}
CE_HEADERS: dict[str, Any] = {
    "ce_specversion": _header("CloudEvents spec version.", const=CE_SPECVERSION),
    "ce_id": _header("The event's id (deduplicate on it)."),
    "ce_type": _header(
        "The event's type, prefixed.",
        enum=sorted(f"{CE_TYPE_PREFIX}{kind}" for kind in EVENT_TYPES),
    ),
    "ce_source": _header("/storage-events/<instance>/<provider>."),
    "ce_subject": _header("The event's key."),
    "ce_time": _header("The event's time (RFC 3339, UTC); absent when it has none."),
    "ce_dataschema": _header(
        f"The value's JSON Schema ({FILE_EVENT_SCHEMA_PATH} in the repository).",
        const=FILE_EVENT_SCHEMA_URI,
    ),
    "content-type": _header("The value's media type.", const="application/json"),
}
CE_REQUIRED = [name for name in CE_HEADERS if name != "ce_time"]
OUTPUT_HEADERS: dict[str, Any] = {
    "type": "object",
    "description": "CloudEvents 1.0 Kafka protocol binding, binary content mode.",
    "required": CE_REQUIRED,
    "properties": CE_HEADERS,
}
STALE_HEADERS: dict[str, Any] = {
    "type": "object",
    "description": "As on the output topic, plus why the event is stale.",
    "required": [*CE_REQUIRED, "stale.reason"],
    "properties": {
        **CE_HEADERS,
        "stale.reason": _header(
            "Which newer event of the key was emitted before, by which ordering token or time."
        ),
    },
}
KEYED_HEADERS: dict[str, Any] = {
    "type": "object",
    "required": [INSTANCE_HEADER],
    "properties": {
        INSTANCE_HEADER: _header("The storage instance the event is for."),
        RECEIVED_AT_HEADER: _header("The raw record's received-at, passed on for latency."),
    },
}
DEAD_LETTER_HEADERS: dict[str, Any] = {
    "type": "object",
    "description": "The original record's headers, plus these three.",
    "required": ["error", "error.stage", "error.topic"],
    "properties": {
        "error": _header("Why it failed (at most 4 KiB)."),
        "error.stage": _header("Where it failed.", enum=["normalize", "emit"]),
        "error.topic": _header("The topic it was read from; replay-dead-letters' default."),
    },
    "additionalProperties": STRING,
}
BYTES: dict[str, Any] = {"type": "string", "format": "binary"}


def _message(
    name: str, title: str, summary: str, payload: Any, headers: Any, key: Any, content_type: str
) -> dict[str, Any]:
    return {
        "name": name,
        "title": title,
        "summary": summary,
        "contentType": content_type,
        "headers": headers,
        "payload": payload,
        "bindings": {"kafka": {"key": key, "bindingVersion": KAFKA_BINDING_VERSION}},
    }


def _event_payload() -> dict[str, Any]:
    """The event schema as an AsyncAPI Schema Object: the JSON Schema's keywords (all of
    draft-07's vocabulary), without the 2020-12 `$schema` and the `$id` it is published as."""
    schema = {k: v for k, v in file_event_schema().items() if k not in ("$schema", "$id")}
    schema["description"] += f" Published as {FILE_EVENT_SCHEMA_URI} ({FILE_EVENT_SCHEMA_PATH})."
    return schema


def _messages() -> dict[str, Any]:
    event = {"$ref": "#/components/schemas/FileEvent"}
    return {
        "rawDelivery": _message(
            "rawDelivery",
            "Raw delivery",
            "A provider's notification exactly as delivered, with how it came.",
            BYTES,
            RAW_HEADERS,
            {"type": ["string", "null"], "description": "Not used by the stream."},
            "application/octet-stream",
        ),
        "keyedEvent": _message(
            "keyedEvent",
            "Keyed event",
            "A canonical event on its way to dedupe and ordering; value byte for byte the "
            "output record's.",
            event,
            KEYED_HEADERS,
            {"type": "string", "description": "<instance>/<bucket>/<key>: one partition per key."},
            "application/json",
        ),
        "fileEvent": _message(
            "fileEvent",
            "File event",
            "One change to one object: deduplicated, in order per key.",
            event,
            OUTPUT_HEADERS,
            {"type": "string", "description": "The event's key (compaction keeps its last)."},
            "application/json",
        ),
        "staleEvent": _message(
            "staleEvent",
            "Stale event",
            "An event older than one already emitted for its key, kept for inspection.",
            event,
            STALE_HEADERS,
            {"type": "string", "description": "The event's key."},
            "application/json",
        ),
        "deadLetter": _message(
            "deadLetter",
            "Dead letter",
            "A record the stream could not handle: its original bytes and headers.",
            BYTES,
            DEAD_LETTER_HEADERS,
            {"type": ["string", "null"], "description": "The original record's key."},
            "application/octet-stream",
        ),
        "stateEntry": _message(
            "stateEntry",
            "State entry",
            "The worker's own state (dedupe ids, ordering marks): internal, no contract.",
            BYTES,
            {"type": "object"},
            {"type": "string", "format": "binary"},
            "application/octet-stream",
        ),
    }


def _topic_configuration(spec: TopicSpec) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for name, value in sorted(spec.config.items()):
        if name == "cleanup.policy":
            config[name] = value.split(",")
        elif INTEGER_CONFIGS.match(value):
            config[name] = int(value)
        else:
            config[name] = value
    return config


CHANNEL_TEXT = {
    "raw": ("rawDelivery", "Raw deliveries", "Bridges write every notification here."),
    "repartition": (
        "keyedEvent",
        "Events by key",
        "Stage one's canonical events, keyed so that every copy of a change and every change "
        "of a key meet in one partition.",
    ),
    "dead-letter": (
        "deadLetter",
        "Dead letters",
        "Records either stage could not handle; `python -m streams replay-dead-letters` "
        "republishes them after a fix.",
    ),
    "changelog": (
        "stateEntry",
        "Worker state",
        "A changelog of the worker's state, restored on start: internal.",
    ),
    "output": (
        "fileEvent",
        "File events",
        "The instance's deduplicated events, in order per key.",
    ),
    "stale": (
        "staleEvent",
        "Stale events",
        "The instance's events that arrived after a newer event of their key.",
    ),
}


def _channel_id(spec: TopicSpec, settings: Settings) -> str:
    if spec.role in ("output", "stale"):
        for instance in settings.instances:
            if spec.name in (instance.output_topic, instance.stale_output_topic):
                return f"{spec.role}.{instance.name}"
    if spec.role == "changelog":
        # changelog_topic's `<app_id>-<table>-changelog`, by its table
        table = spec.name.removeprefix(f"{settings.stream.app_id}-").removesuffix("-changelog")
        return f"changelog.{table}"
    if spec.role == "raw":
        return f"raw.{spec.name}"
    return spec.role


def _channel(channel_id: str, spec: TopicSpec) -> dict[str, Any]:
    message, title, description = CHANNEL_TEXT[spec.role]
    if spec.role in ("output", "stale"):
        title = f"{title}: {channel_id.split('.', 1)[1]}"
    return {
        "address": spec.name,
        "title": title,
        "description": description,
        "messages": {message: {"$ref": f"#/components/messages/{message}"}},
        "bindings": {
            "kafka": {
                "topic": spec.name,
                "partitions": spec.partitions,
                "replicas": spec.replication_factor,
                "topicConfiguration": _topic_configuration(spec),
                "bindingVersion": KAFKA_BINDING_VERSION,
            }
        },
    }


def _operation(
    action: str, channel_id: str, summary: str, group: str | None = None
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "action": action,
        "channel": {"$ref": f"#/channels/{channel_id}"},
        "summary": summary,
    }
    if group is not None:
        operation["bindings"] = {
            "kafka": {
                "groupId": {"type": "string", "enum": [group]},
                "bindingVersion": KAFKA_BINDING_VERSION,
            }
        }
    return operation


def _operations(channel_ids: dict[str, str], settings: Settings) -> dict[str, Any]:
    """Who writes and reads each channel: bridges, the worker's two stages, replay."""
    app = settings.stream.app_id
    normalize, emit = f"{app}-normalize", f"{app}-emit"
    operations: dict[str, Any] = {}
    for channel_id, role in channel_ids.items():
        if role == "raw":
            operations[f"bridgesWrite.{channel_id}"] = _operation(
                "send",
                channel_id,
                "A bridge (webhook, SQS, Pub/Sub, Azure queue, reconcile) "
                "or replay-dead-letters writes a delivery.",
            )
            operations[f"normalizeRead.{channel_id}"] = _operation(
                "receive", channel_id, "Stage one reads deliveries.", normalize
            )
        elif role == "repartition":
            operations["normalizeWrite.repartition"] = _operation(
                "send", channel_id, "Stage one writes each event keyed."
            )
            operations["emitRead.repartition"] = _operation(
                "receive", channel_id, "Stage two dedupes and orders them.", emit
            )
        elif role == "dead-letter":
            operations["workerWrite.dead-letter"] = _operation(
                "send", channel_id, "Either stage writes what it could not handle."
            )
            operations["replayRead.dead-letter"] = _operation(
                "receive", channel_id, "replay-dead-letters reads them (no group)."
            )
        elif role == "changelog":
            operations[f"emitWrite.{channel_id}"] = _operation(
                "send", channel_id, "Stage two records its state, in its transactions."
            )
            operations[f"emitRestore.{channel_id}"] = _operation(
                "receive", channel_id, "Stage two restores its state (no group)."
            )
        else:
            operations[f"emitWrite.{channel_id}"] = _operation(
                "send", channel_id, "Stage two writes the instance's events."
            )
    return operations


def asyncapi_document(settings: Settings) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of `settings`' topics."""
    specs = topology(settings)
    channel_ids = {_channel_id(spec, settings): spec for spec in specs}
    if len(channel_ids) != len(specs):  # a new kind of topic needs its own channel id
        raise ValueError(f"two topics share a channel id: {sorted(channel_ids)}")
    servers = {
        SERVER: {
            "host": settings.kafka.bootstrap_servers,
            "protocol": "kafka",
            "description": "The Kafka cluster (kafka.bootstrap_servers).",
        }
    }
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "storage-events",
            "version": f"{FILE_EVENT_SCHEMA_VERSION}.0.0",
            "description": (
                "Object-storage notifications from every provider, as one deduplicated, "
                "per-key ordered Kafka topic per storage instance. Generated by "
                "`python -m streams asyncapi` from streams/engine/topics.py; consumers read the "
                "output channels."
            ),
        },
        "defaultContentType": "application/json",
        "servers": servers,
        "channels": {
            channel_id: _channel(channel_id, spec) for channel_id, spec in channel_ids.items()
        },
        "operations": _operations(
            {channel_id: spec.role for channel_id, spec in channel_ids.items()}, settings
        ),
        "components": {
            "schemas": {"FileEvent": _event_payload()},
            "messages": _messages(),
        },
    }
