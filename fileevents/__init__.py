"""fileevents: handlers for an instance's canonical file events, on Kafka.

    events = FileEvents(bootstrap_servers="127.0.0.1:9092", instance="uploads",
                        group_id="thumbnails")

    @events.on("created")
    async def make_thumbnail(event: FileEvent) -> None: ...

    await events.run()

See fileevents/README.md for the guarantees and examples/ for runnable programs.
"""

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
from fileevents.metrics import FileEventsMetrics
from fileevents.processing import Outcome
from fileevents.retry import RetryPolicy
from streams.core.event import FileEvent
from streams.kafka_settings import KafkaAccessError, KafkaSettings

__all__ = [
    "DedupeStore",
    "DedupeStoreUnavailable",
    "EventContext",
    "EventDecodeError",
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
    "log_failure",
]
