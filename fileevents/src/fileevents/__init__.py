"""fileevents: handlers for an instance's canonical file events, on Kafka.

    events = FileEvents(bootstrap_servers="127.0.0.1:9092", instance="uploads",
                        group_id="thumbnails")

    @events.on("created")
    async def make_thumbnail(event: FileEvent) -> None: ...

    await events.run()

See the package's README.md for the guarantees, and the storage-events repository's examples/
for runnable programs.

The names below are imported when first used (PEP 562), so that `fileevents.event`, the
event model the stream imports too, loads without the Kafka client, the metrics or the rest of
the consumer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fileevents.app import FileEvents, default_topic
    from fileevents.context import EventContext
    from fileevents.dedupe import (
        DedupeStore,
        DedupeStoreUnavailable,
        MemoryDedupeStore,
        PerIdDedupeStore,
        RedisDedupeStore,
        dedupe_id,
    )
    from fileevents.errors import EventDecodeError, Failure, HandlerTimeout, OnError, log_failure
    from fileevents.event import EventType, FileEvent, format_time
    from fileevents.kafka_settings import KafkaAccessError, KafkaSettings
    from fileevents.metrics import FileEventsMetrics
    from fileevents.processing import Outcome
    from fileevents.retry import RetryPolicy

_WHERE = {
    "FileEvents": "app",
    "default_topic": "app",
    "EventContext": "context",
    "DedupeStore": "dedupe",
    "DedupeStoreUnavailable": "dedupe",
    "MemoryDedupeStore": "dedupe",
    "PerIdDedupeStore": "dedupe",
    "RedisDedupeStore": "dedupe",
    "dedupe_id": "dedupe",
    "EventDecodeError": "errors",
    "Failure": "errors",
    "HandlerTimeout": "errors",
    "OnError": "errors",
    "log_failure": "errors",
    "EventType": "event",
    "FileEvent": "event",
    "format_time": "event",
    "KafkaAccessError": "kafka_settings",
    "KafkaSettings": "kafka_settings",
    "FileEventsMetrics": "metrics",
    "Outcome": "processing",
    "RetryPolicy": "retry",
}
"""Each public name and the module of this package it lives in."""

__all__ = [
    "DedupeStore",
    "DedupeStoreUnavailable",
    "EventContext",
    "EventDecodeError",
    "EventType",
    "Failure",
    "FileEvent",
    "FileEvents",
    "FileEventsMetrics",
    "HandlerTimeout",
    "KafkaAccessError",
    "KafkaSettings",
    "MemoryDedupeStore",
    "OnError",
    "Outcome",
    "PerIdDedupeStore",
    "RedisDedupeStore",
    "RetryPolicy",
    "dedupe_id",
    "default_topic",
    "format_time",
    "log_failure",
]


def __getattr__(name: str) -> Any:
    """`fileevents.<name>`: the public name from its module, imported on first use."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'fileevents' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fileevents.{module}"), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
