"""Topics are created in CreateTopics requests KRaft accepts: each of at most
MAX_RECORDS_PER_REQUEST metadata records (a topic, its partitions, its configs), in order,
every topic once; and a line of topic names stays short at 2,000 names."""

from __future__ import annotations

from streams.engine.topics import (
    MAX_RECORDS_PER_REQUEST,
    NAMES_SHOWN,
    TopicSpec,
    creation_batches,
    names_line,
)


def records(spec: TopicSpec) -> int:
    return 1 + spec.partitions + len(spec.config)


def test_the_topics_of_a_thousand_instances_go_in_batches_the_controller_accepts() -> None:
    config = {"retention.ms": "1", "max.message.bytes": "2", "min.insync.replicas": "1"}
    specs = [TopicSpec(f"files.events.tenant-{i}", 4, 1, config) for i in range(2_006)]
    batches = creation_batches(specs)
    assert [spec for batch in batches for spec in batch] == specs
    assert len(batches) > 1
    assert all(sum(records(spec) for spec in batch) <= MAX_RECORDS_PER_REQUEST for batch in batches)


def test_a_topic_larger_than_a_batch_goes_alone_and_a_few_go_together() -> None:
    huge = TopicSpec("huge", MAX_RECORDS_PER_REQUEST + 10, 1, {})
    small = [TopicSpec(f"t{i}", 1, 1, {}) for i in range(3)]
    assert creation_batches([small[0], huge, *small[1:]]) == [[small[0]], [huge], small[1:]]
    assert creation_batches(small) == [small]
    assert creation_batches([]) == []


def test_a_line_of_names_says_how_many_more() -> None:
    names = [f"t{i}" for i in range(2_006)]
    line = names_line(names)
    assert line.startswith(", ".join(names[:NAMES_SHOWN]))
    assert line.endswith(f"... and {2_006 - NAMES_SHOWN:,} more")
    assert names_line(names[:3]) == "t0, t1, t2"
