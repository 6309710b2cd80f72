"""Topics and offsets on confluent-kafka's AdminClient (issue 32, item 5).

Topic creation keeps its batches (one CreateTopics request per batch: KRaft refuses a request
of more than 10,000 records, issue 33), and the offsets a stage group adopts or the
repartition topic's resolution reads are asked per named partition: a group the cluster has
never seen must answer "none", not crash the process (confluent-kafka 2.16.2 segfaults on a
whole-group OffsetFetch of such a group).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from support.worker import wait_for

from streams.engine import topics
from streams.engine.offsets import adopt_committed_offsets, committed_topics
from streams.engine.records import TopicPartition
from streams.engine.topics import TopicSpec, creation_batches, ensure_topics

pytestmark = pytest.mark.kafka


def test_topics_go_in_one_create_request_per_batch_and_all_exist(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topics, "MAX_RECORDS_PER_REQUEST", 8)  # 2 topics of 4 records
    suffix = uuid.uuid4().hex[:8]
    specs = [TopicSpec(f"batched-{suffix}-{n}", 2, 1, {"retention.ms": "60000"}) for n in range(5)]
    assert len(creation_batches(specs)) == 3
    requests: list[list[str]] = []
    create = AdminClient.create_topics

    def counted(self: AdminClient, new_topics: list[Any], **kwargs: Any) -> Any:
        requests.append([topic.topic for topic in new_topics])
        return create(self, new_topics, **kwargs)

    monkeypatch.setattr(AdminClient, "create_topics", counted)
    created = asyncio.run(ensure_topics(kafka_bootstrap, specs, retry_for_s=30))
    assert sorted(created) == sorted(spec.name for spec in specs)
    assert requests == [[spec.name for spec in batch] for batch in creation_batches(specs)]

    reader = AdminClient({"bootstrap.servers": kafka_bootstrap})

    def listed() -> bool:  # the broker lists a created topic a moment later
        found = reader.list_topics(timeout=10).topics
        return all(spec.name in found and len(found[spec.name].partitions) == 2 for spec in specs)

    wait_for(listed, 30, "the created topics to be listed")
    requests.clear()
    assert asyncio.run(ensure_topics(kafka_bootstrap, specs, retry_for_s=30)) == []
    assert requests == []  # nothing missing: no CreateTopics at all


def test_a_group_the_cluster_never_saw_has_no_offsets_and_adopts_the_old_groups(
    kafka_bootstrap: str,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic = f"offsets-{suffix}"
    asyncio.run(ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2, 1)], retry_for_s=30))
    unseen = f"never-{suffix}"
    assert asyncio.run(committed_topics(kafka_bootstrap, unseen, [topic, "no-such-topic"])) == set()
    # An old group with offsets on partition 1 only: the new one takes exactly those.
    old, new = f"old-{suffix}", f"new-{suffix}"
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka import TopicPartition as RdTopicPartition

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(old, [RdTopicPartition(topic, 1, 0)])]
    )[old].result(30)
    adopted = asyncio.run(adopt_committed_offsets(kafka_bootstrap, old, new, [topic]))
    assert adopted == {TopicPartition(topic, 1): 0}
    assert asyncio.run(committed_topics(kafka_bootstrap, new, [topic])) == {topic}
    # Once it has its own, it adopts nothing again.
    assert asyncio.run(adopt_committed_offsets(kafka_bootstrap, old, new, [topic])) == {}
