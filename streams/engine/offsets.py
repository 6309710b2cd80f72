"""Upgrading from the two Faust agents: the stages take over the offsets Faust's group committed.

Until the batch stages, both agents consumed in one consumer group named after the app id
(`<app_id>`: the raw topics and the repartition topic). The stages consume as
`<app_id>-normalize` and `<app_id>-emit`. On a stage group's first start, with no offsets of
its own, it adopts the old group's committed offsets of its topics, so an upgraded worker
goes on where the old one stopped instead of reading the raw topics' whole retention again.
(The state needs nothing: it comes back from the same changelog topics, in the same format.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient

from streams.engine.librdkafka import librdkafka_log
from streams.engine.records import TopicPartition
from streams.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 15.0
"""One admin request (metadata, OffsetFetch, OffsetCommit) answered within this, or the call
fails as when Kafka is away, and its caller retries."""


class OffsetsUnavailable(Exception):
    """Kafka did not answer an offsets request (away, or refused it): the caller retries."""


def _admin(kafka: KafkaSettings) -> AdminClient:
    config: dict[str, Any] = {
        **kafka.librdkafka_config(),
        "client.id": "storage-events-offsets",
        "logger": librdkafka_log(),  # its lines through the log, never raw on stderr
    }
    return AdminClient(config)


def _partitions(admin: AdminClient, topics: Collection[str]) -> list[RdTopicPartition]:
    """Every partition of those of `topics` that exist (one metadata request)."""
    metadata = admin.list_topics(timeout=CALL_TIMEOUT_S)
    return [
        RdTopicPartition(topic, partition)
        for topic in sorted(topics)
        if topic in metadata.topics and metadata.topics[topic].error is None
        for partition in sorted(metadata.topics[topic].partitions)
    ]


def _committed(
    admin: AdminClient, group: str, partitions: list[RdTopicPartition]
) -> dict[TopicPartition, int]:
    """`group`'s committed offsets of `partitions` (those it has one for).

    Always names the partitions: librdkafka's OffsetFetch for a whole group the cluster has
    not seen crashes the process (a segfault in confluent-kafka 2.16.2's binding, issue
    1982, measured here), and a stage group's first start is exactly that."""
    if not partitions:
        return {}
    request = [ConsumerGroupTopicPartitions(group, partitions)]
    answer = admin.list_consumer_group_offsets(request, request_timeout=CALL_TIMEOUT_S)[group]
    found: dict[TopicPartition, int] = {}
    for tp in answer.result(CALL_TIMEOUT_S + 5).topic_partitions or []:
        if tp.error is not None:
            raise KafkaException(tp.error)
        if tp.offset >= 0:
            found[TopicPartition(tp.topic, tp.partition)] = tp.offset
    return found


def _commit(admin: AdminClient, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit `offsets` for `group`, which has no member (OffsetCommit from the admin)."""
    partitions = [
        RdTopicPartition(tp.topic, tp.partition, offset) for tp, offset in offsets.items()
    ]
    request = [ConsumerGroupTopicPartitions(group, partitions)]
    answer = admin.alter_consumer_group_offsets(request, request_timeout=CALL_TIMEOUT_S)[group]
    for tp in answer.result(CALL_TIMEOUT_S + 5).topic_partitions or []:
        if tp.error is not None:
            raise KafkaException(tp.error)


def _adopt(
    kafka: KafkaSettings, old_group: str, new_group: str, topics: Collection[str]
) -> dict[TopicPartition, int]:
    admin = _admin(kafka)
    partitions = _partitions(admin, topics)
    if _committed(admin, new_group, partitions):
        return {}
    adopted = _committed(admin, old_group, partitions)
    if adopted:
        _commit(admin, new_group, adopted)
    return adopted


async def _run(work: Any, *args: Any) -> Any:
    """`work(*args)` in a thread (its requests block); Kafka's refusal or silence raised as
    OffsetsUnavailable."""
    try:
        return await asyncio.to_thread(work, *args)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        said = error.str() if isinstance(error, KafkaError) else str(exc)
        raise OffsetsUnavailable(said) from exc
    except TimeoutError as exc:  # a future not answered in time (concurrent.futures)
        raise OffsetsUnavailable(f"no answer within {CALL_TIMEOUT_S:.0f} s") from exc


async def adopt_committed_offsets(
    kafka: KafkaSettings | str, old_group: str, new_group: str, topics: Collection[str]
) -> dict[TopicPartition, int]:
    """Commit `old_group`'s offsets of `topics` for `new_group`, if it has none of its own.

    Returns what was adopted. Call it before the new group's members start (Kafka commits
    an admin's offsets only for a group without members)."""
    adopted: dict[TopicPartition, int] = await _run(
        _adopt, KafkaSettings.of(kafka), old_group, new_group, topics
    )
    if adopted:
        log.info(
            "%s starts where %s stopped: %s",
            new_group,
            old_group,
            ", ".join(
                f"{tp.topic}[{tp.partition}]@{offset}" for tp, offset in sorted(adopted.items())
            ),
        )
    return adopted


def _committed_topics(kafka: KafkaSettings, group: str, topics: Collection[str]) -> set[str]:
    admin = _admin(kafka)
    return {tp.topic for tp in _committed(admin, group, _partitions(admin, topics))}


async def committed_topics(
    kafka: KafkaSettings | str, group: str, topics: Collection[str]
) -> set[str]:
    """Those of `topics` `group` has committed offsets on."""
    found: set[str] = await _run(_committed_topics, KafkaSettings.of(kafka), group, topics)
    return found
