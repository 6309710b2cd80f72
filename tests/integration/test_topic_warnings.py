"""A topic that exists before the worker starts (made by its owner, or an older version) and is
weaker than the stream's settings ask is named at start-up, one line per setting with the fix:
fewer replicas than `stream.replication_factor`, a lower `min.insync.replicas` than
`stream.min_insync_replicas`, smaller records than the stream writes. Nothing is altered."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from streams.engine.topics import MIN_INSYNC_REPLICAS, TopicsNotCreated, TopicSpec, ensure_topics

pytestmark = pytest.mark.kafka


def test_an_existing_weaker_topic_is_named_per_setting_and_left_as_it_is(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    weak, fine = f"weak-{uuid.uuid4().hex[:8]}", f"fine-{uuid.uuid4().hex[:8]}"
    as_created = {MIN_INSYNC_REPLICAS: "1", "max.message.bytes": "2048"}
    created = asyncio.run(
        ensure_topics(
            kafka_bootstrap,
            [TopicSpec(weak, 1, 1, as_created), TopicSpec(fine, 1, 1, as_created)],
            retry_for_s=30,
        )
    )
    assert sorted(created) == sorted([weak, fine])

    # The stream as a three-broker deployment configures it: 3 replicas, 2 in sync, 1 MiB.
    stronger = {MIN_INSYNC_REPLICAS: "2", "max.message.bytes": str(1024 * 1024)}
    with caplog.at_level(logging.WARNING, "streams.engine.topics"):
        created = asyncio.run(
            ensure_topics(
                kafka_bootstrap,
                [TopicSpec(weak, 1, 3, stronger), TopicSpec(fine, 1, 1, as_created)],
                retry_for_s=30,
            )
        )
    assert created == []
    lines = [record.getMessage() for record in caplog.records]
    about_weak = [line for line in lines if f"topic {weak} " in line]
    assert len(about_weak) == 3, lines
    assert any(
        "has 1 replica(s), the stream asks for 3 (stream.replication_factor)" in line
        for line in about_weak
    ), about_weak
    assert any(
        "min.insync.replicas=1, the stream asks for 2 (stream.min_insync_replicas)" in line
        for line in about_weak
    ), about_weak
    assert any("max.message.bytes=1048576" in line for line in about_weak), about_weak
    assert not [line for line in lines if fine in line], lines  # as asked: nothing said


def test_topics_kafka_refuses_to_create_are_named_with_its_reason(kafka_bootstrap: str) -> None:
    """aiokafka returns CreateTopics' per-topic errors in its answer without raising: before
    2026-12-07 a refused topic was reported as created (and 1,000 instances' topics, over
    KRaft's limit per request, were all refused in silence: the worker never got ready)."""
    fine, refused = f"fine-{uuid.uuid4().hex[:8]}", f"refused-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TopicsNotCreated) as raised:
        asyncio.run(
            ensure_topics(
                kafka_bootstrap,
                [TopicSpec(fine, 1, 1, {}), TopicSpec(refused, 1, 3, {})],  # one broker
                retry_for_s=30,
            )
        )
    message = str(raised.value)
    assert refused in message and fine not in message, message
    assert "replication factor" in message.lower(), message
