"""Upgrading from the two Faust agents: the stages take over the offsets Faust's group committed.

Until the batch stages, both agents consumed in one consumer group named after the app id
(`<app_id>`: the raw topics and the repartition topic). The stages consume as
`<app_id>-normalize` and `<app_id>-emit`. On a stage group's first start, with no offsets of
its own, it adopts the old group's committed offsets of its topics, so an upgraded worker
goes on where the old one stopped instead of reading the raw topics' whole retention again.
(The state needs nothing: it comes back from the same changelog topics, in the same format.)
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)


async def adopt_committed_offsets(
    kafka: KafkaSettings | str, old_group: str, new_group: str, topics: Collection[str]
) -> dict[TopicPartition, int]:
    """Commit `old_group`'s offsets of `topics` for `new_group`, if it has none of its own.

    Returns what was adopted. Call it before the new group's members start."""
    kafka = KafkaSettings.of(kafka)
    admin = AIOKafkaAdminClient(**kafka.aiokafka_args(), client_id="storage-events-offsets")
    await admin.start()
    try:
        own = await admin.list_consumer_group_offsets(new_group)
        if any(tp.topic in topics and meta.offset >= 0 for tp, meta in own.items()):
            return {}
        old = await admin.list_consumer_group_offsets(old_group)
    finally:
        await admin.close()
    adopted = {
        tp: meta.offset for tp, meta in old.items() if tp.topic in topics and meta.offset >= 0
    }
    if not adopted:
        return {}
    consumer = AIOKafkaConsumer(
        **kafka.aiokafka_args(),
        client_id="storage-events-offsets",
        group_id=new_group,
        enable_auto_commit=False,
    )
    try:
        await consumer.start()
        consumer.assign(list(adopted))
        await consumer.commit(adopted)
    finally:
        await consumer.stop()
    log.info(
        "%s starts where %s stopped: %s",
        new_group,
        old_group,
        ", ".join(f"{tp.topic}[{tp.partition}]@{offset}" for tp, offset in sorted(adopted.items())),
    )
    return adopted


async def committed_topics(kafka: KafkaSettings | str, group: str) -> set[str]:
    """The topics `group` has committed offsets on (aiokafka's admin client: librdkafka's
    OffsetFetch of a group the cluster has not seen can crash the process, confluent-kafka
    issue 1982)."""
    admin = AIOKafkaAdminClient(
        **KafkaSettings.of(kafka).aiokafka_args(), client_id="storage-events-offsets"
    )
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.topic for tp, meta in offsets.items() if meta.offset >= 0}
