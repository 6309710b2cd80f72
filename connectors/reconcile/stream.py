"""What the stream knows per key, for the comparison with a listing.

The comparison takes any `StreamKnowledge`: a callable yielding one `Known` per key (present
or deleted, ETag, ordering token), the last word the stream gave consumers about that key.
Today's source is `OutputTopicKnowledge`: the instance's output topic (`files.events.<instance>`,
or its configured `topic`), read from the beginning to its end offsets at that moment with
`isolation.level=read_committed`, keeping the last event per key for this bucket. A `deleted`
with `version_only: true` is skipped (a noncurrent version went; the key lives on).

The output topic is the product's own contract, co-partitioned by key and holding exactly
what consumers saw, so this compares the listing with what consumers were told. It needs the
output topic to keep every key's last event (compaction keeps it; retention alone may not): an
event that aged out makes its key look unknown, and reconcile announces it once more. Another
source (a compacted per-key state topic) plugs in by being another `StreamKnowledge`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from connectors.reconcile.drift import Known
from streams.core.normalizers.base import MalformedDelivery, parse_time, strip_quotes
from streams.kafka_settings import KafkaSettings, check_access

log = logging.getLogger(__name__)

StreamKnowledge = Callable[[], Iterable[Known]]
"""What the stream knows: one `Known` per key (a later one for a key replaces an earlier)."""

TOPIC_AUTHORIZATION_FAILED = 29
UNKNOWN_TOPIC_OR_PARTITION = 3


class StreamReadError(Exception):
    """Reading what the stream knows failed, as one line."""


def last_events(values: Iterable[bytes | None], bucket: str | None) -> dict[str, Known]:
    """The last event per key among output-topic values (in offset order), for `bucket`."""
    known: dict[str, Known] = {}
    unreadable = 0
    for value in values:
        try:
            event = json.loads(value or b"")
            key, event_type = event["key"], event["type"]
            if not isinstance(key, str) or event_type not in ("created", "deleted"):
                raise ValueError("not a canonical event")
            if event.get("bucket") != bucket:
                continue
            if event_type == "deleted" and event.get("version_only") is True:
                continue  # a noncurrent version went; the key lives on
            etag, token = event.get("etag"), event.get("sequencer")
            known[key] = Known(
                key=key,
                type=event_type,
                etag=strip_quotes(etag) if isinstance(etag, str) else None,
                time=parse_time(event.get("time")),
                token=token if isinstance(token, str) else None,
            )
        except (ValueError, KeyError, TypeError, MalformedDelivery):
            unreadable += 1
    if unreadable:
        log.warning("%d output records are not canonical events; ignored", unreadable)
    return known


def topic_problem(topic: str, error_code: int) -> str | None:
    """The one line for a topic's metadata error code (None: readable)."""
    if error_code == 0:
        return None
    if error_code == TOPIC_AUTHORIZATION_FAILED:
        return (
            f"not authorized to read output topic {topic}: this principal lacks Describe/Read "
            "on it (grant what `python -m streams acls --component reconcile` prints)"
        )
    if error_code == UNKNOWN_TOPIC_OR_PARTITION:
        return f"output topic {topic} does not exist (has the worker run with this config?)"
    return f"output topic {topic} cannot be described (Kafka error code {error_code})"


async def read_output(
    kafka: KafkaSettings | str, topic: str, timeout_s: float
) -> list[bytes | None]:
    """Every committed value of `topic`, per partition in offset order, up to its end offsets."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError
    from aiokafka.protocol.metadata import MetadataRequest

    kafka = KafkaSettings.of(kafka)
    bootstrap = kafka.bootstrap_servers
    problem = await check_access(kafka, timeout_s)
    if problem is not None:  # a refused password or certificate: one line naming the setting
        raise StreamReadError(problem[0])
    admin = AIOKafkaAdminClient(**kafka.aiokafka_args(), client_id="storage-events-reconcile")
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        # This topic's metadata only, never creating it: the error code tells a topic that
        # is missing from one this principal may not describe (listing all topics cannot:
        # both are simply absent from the list).
        response = await admin._send_request(
            MetadataRequest([topic], allow_auto_topic_creation=False)
        )
        [description] = [t for t in response.to_object()["topics"] if t["topic"] == topic]
        problem_line = topic_problem(topic, int(description["error_code"]))
        if problem_line is not None:
            raise StreamReadError(problem_line)
        partitions = sorted(int(item["partition"]) for item in description["partitions"])
    except (KafkaError, TimeoutError) as exc:
        raise StreamReadError(f"cannot reach Kafka at {bootstrap}: {exc!r}") from None
    finally:
        await admin.close()

    consumer = AIOKafkaConsumer(
        **kafka.aiokafka_args(),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        client_id="storage-events-reconcile",
    )
    try:
        await asyncio.wait_for(consumer.start(), timeout_s)
        assignment = [TopicPartition(topic, partition) for partition in partitions]
        consumer.assign(assignment)
        await consumer.seek_to_beginning(*assignment)
        ends = await consumer.end_offsets(assignment)
        values: dict[int, list[bytes | None]] = {partition: [] for partition in partitions}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            behind = [tp for tp in assignment if await consumer.position(tp) < ends[tp]]
            if not behind:
                break
            if loop.time() > deadline:
                raise StreamReadError(f"reading {topic} did not reach its end within {timeout_s} s")
            batches = await consumer.getmany(*behind, timeout_ms=500)
            for tp, messages in batches.items():
                values[tp.partition].extend(
                    message.value for message in messages if message.offset < ends[tp]
                )
        return [value for partition in partitions for value in values[partition]]
    except (KafkaError, TimeoutError) as exc:
        name = type(exc).__name__
        if "Authorization" in name:
            raise StreamReadError(
                f"not authorized to read output topic {topic} ({name}): grant Read on it "
                "(what `python -m streams acls --component reconcile` prints)"
            ) from None
        raise StreamReadError(f"reading {topic} failed: {exc!r}") from None
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class OutputTopicKnowledge:
    """The last event per key of the instance's output topic, for one bucket."""

    kafka: KafkaSettings
    topic: str
    bucket: str | None
    timeout_s: float

    def __call__(self) -> Iterable[Known]:
        values = asyncio.run(read_output(self.kafka, self.topic, self.timeout_s))
        return last_events(values, self.bucket).values()
