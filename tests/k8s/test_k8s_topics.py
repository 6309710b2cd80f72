"""Every topic the code uses has a Strimzi KafkaTopic that matches it, in every overlay.

The expected topics are not listed here: they come from `streams.engine.topics.topology()` called
on the configuration each overlay ships (its ConfigMap's streams.toml and the environment
its worker pod gets), plus Faust's leader topic `<app_id>-__assignor-__leader`. So a topic
added to the code, or an instance added to the config, fails this test until its KafkaTopic
exists, and the failure prints the KafkaTopic to add.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_objects import Resource, of_kind, shipped_settings

from streams.config import InstanceConfig, Settings
from streams.engine.topics import TopicSpec, topology

MIN_INSYNC = "min.insync.replicas"


def expected_topics(settings: Settings) -> list[TopicSpec]:
    leader = TopicSpec(
        f"{settings.stream.app_id}-__assignor-__leader",
        1,
        settings.stream.replication_factor,
        # Faust creates it with the cluster's default; the KafkaTopic sets it like the others'.
        {MIN_INSYNC: str(settings.stream.min_insync_replicas)},
        "faust-leader",
    )
    return [*topology(settings), leader]


def wanted_min_insync(replicas: int) -> int:
    """2 of 3 (or more): a write survives one broker down, and one broker may be down."""
    return 2 if replicas >= 3 else 1


def kafkatopic_yaml(spec: TopicSpec, min_insync: int) -> str:
    name = spec.name.lower().replace("_", "").replace("--", "-")
    resource = {
        "apiVersion": "kafka.strimzi.io/v1beta2",
        "kind": "KafkaTopic",
        "metadata": {"name": name, "labels": {"strimzi.io/cluster": "my-cluster"}},
        "spec": {
            "topicName": spec.name,
            "partitions": spec.partitions,
            "replicas": spec.replication_factor,
            "config": {MIN_INSYNC: min_insync, **spec.config},
        },
    }
    return str(yaml.safe_dump(resource, sort_keys=False))


def mismatches(settings: Settings, topics: list[Resource]) -> list[str]:
    """What is wrong between the code's topics and the KafkaTopics; empty when they match."""
    by_name: dict[str, Resource] = {}
    problems: list[str] = []
    for topic in topics:
        name = topic["spec"].get("topicName") or topic["metadata"]["name"]
        if name in by_name:
            problems.append(f"two KafkaTopics for topic {name}")
        by_name[name] = topic
    expected = expected_topics(settings)
    for spec in expected:
        declared = by_name.get(spec.name)
        if declared is None:
            problems.append(
                f"no KafkaTopic for {spec.role} topic {spec.name}; add to k8s/topics/topics.yaml:"
                f"\n---\n{kafkatopic_yaml(spec, wanted_min_insync(spec.replication_factor))}"
            )
            continue
        found: dict[str, Any] = declared["spec"]
        config = {key: str(value) for key, value in found.get("config", {}).items()}
        if found.get("partitions") != spec.partitions:
            problems.append(
                f"{spec.name}: partitions {found.get('partitions')}, code: {spec.partitions}"
            )
        if found.get("replicas") != spec.replication_factor:
            problems.append(
                f"{spec.name}: replicas {found.get('replicas')}, code: {spec.replication_factor}"
            )
        insync = int(config.get(MIN_INSYNC, "0"))  # also in spec.config (min_insync_replicas)
        if insync != wanted_min_insync(spec.replication_factor):
            problems.append(
                f"{spec.name}: {MIN_INSYNC} {insync} with {spec.replication_factor} replicas"
            )
        if config != spec.config:
            problems.append(f"{spec.name}: config {config}, code: {spec.config}")
    unknown = sorted(set(by_name) - {spec.name for spec in expected})
    problems += [f"KafkaTopic for {name}, a topic the code does not use" for name in unknown]
    return problems


@pytest.mark.parametrize("overlay", ("dev", "prod"))
def test_every_topic_of_the_code_has_a_matching_kafkatopic(
    overlays: dict[str, list[Resource]], overlay: str, tmp_path: Path
) -> None:
    resources = overlays[overlay]
    settings = shipped_settings(resources, tmp_path)
    problems = mismatches(settings, of_kind(resources, "KafkaTopic"))
    assert not problems, f"{overlay}:\n" + "\n".join(problems)


def test_prod_topics_have_three_replicas_and_two_in_sync(
    overlays: dict[str, list[Resource]], tmp_path: Path
) -> None:
    resources = overlays["prod"]
    assert shipped_settings(resources, tmp_path).stream.replication_factor == 3
    topics = of_kind(resources, "KafkaTopic")
    for topic in topics:
        assert topic["spec"]["replicas"] == 3, topic["metadata"]["name"]
        assert topic["spec"]["config"][MIN_INSYNC] == 2, topic["metadata"]["name"]
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == "prod-kafka"
        assert topic["metadata"]["namespace"] == "kafka"


def test_the_dedupe_changelog_is_bounded_by_the_longest_ttl(
    overlays: dict[str, list[Resource]], tmp_path: Path
) -> None:
    resources = overlays["prod"]
    settings = shipped_settings(resources, tmp_path)
    seen = next(
        t
        for t in of_kind(resources, "KafkaTopic")
        if t["spec"]["topicName"].endswith("-seen-changelog")
    )
    longest_ttl_ms = max(instance.dedupe_ttl for instance in settings.instances) * 1000
    assert seen["spec"]["config"]["cleanup.policy"] == "compact,delete"
    assert int(seen["spec"]["config"]["retention.ms"]) == longest_ttl_ms + 3600 * 1000


def test_a_topic_the_code_adds_fails_the_check(
    overlays: dict[str, list[Resource]], tmp_path: Path
) -> None:
    """The check is not circular: one more instance means two topics without a KafkaTopic,
    and a longer TTL means a changelog retention that no longer matches."""
    resources = overlays["prod"]
    settings = shipped_settings(resources, tmp_path)
    grown = settings.model_copy(
        update={
            "instances": (
                *settings.instances,
                InstanceConfig(name="tenant-new", dedupe_ttl=7 * 86400),
            )
        }
    )
    problems = mismatches(grown, of_kind(resources, "KafkaTopic"))
    text = "\n".join(problems)
    assert "no KafkaTopic for output topic files.events.tenant-new" in text
    assert "no KafkaTopic for stale topic files.stale.tenant-new" in text
    assert "storage-events-seen-changelog: config" in text
    assert "topicName: files.events.tenant-new" in text  # the YAML to paste
