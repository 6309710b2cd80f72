"""Every topic the stream uses, with its partitions and policies, created at start-up.

One list (`topology`) serves the worker's start-up, `python -m streams create-topics`, and
the Kubernetes `KafkaTopic` manifests' checks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._metadata import ClusterMetadata
from confluent_kafka.admin._resource import ResourceType as RdResourceType
from confluent_kafka.cimpl import NewTopic

from streams.config import LEGACY_REPARTITION_TOPIC, Settings
from streams.core.records import EVENT_MAX_MESSAGE_BYTES as EVENT_MAX_MESSAGE_BYTES
from streams.core.records import RAW_MAX_MESSAGE_BYTES as RAW_MAX_MESSAGE_BYTES
from streams.engine.librdkafka import librdkafka_log
from streams.engine.offsets import OffsetsUnavailable, committed_topics
from streams.kafka_settings import KafkaAccessError, KafkaSettings, check_access

log = logging.getLogger(__name__)

DAY_MS = 24 * 3600 * 1000
MIN_INSYNC_REPLICAS = "min.insync.replicas"
"""Set on every topic the stream creates, from `stream.min_insync_replicas`."""
KEYS_TABLE = "keys"
SEEN_TABLE = "seen"
MARKS_TABLE = "marks"

# Record size limits (`max.message.bytes`, which bounds one record batch), one per kind of
# topic; every topic the stream creates sets its own explicitly (the broker default of 1 MiB
# is nobody's decision), and what the worker writes is held below them: stage one
# dead-letters an event whose records would not fit (streams.core.routing), and a record Kafka
# refuses anyway is replaced by a dead letter (streams.engine.librdkafka.producer). A raw record
# and the records of one event (RAW_/EVENT_MAX_MESSAGE_BYTES) are bounded in the core
# (streams.core.records), which routing decides by; the topics take them from there.
DEAD_LETTER_HEADROOM_BYTES = 64 * 1024
"""What a dead letter adds to the record it carries: `error` (at most 4 KiB), `error.stage`,
`error.topic` and their framing, with room to spare."""
PULLED_MAX_MESSAGE_BYTES = 10 * 1000 * 1000
"""The largest message a pull bridge can be handed: Pub/Sub's limit (data and attributes; an
SQS message is at most 1 MiB, an Azure queue message 64 KiB). A message over the raw topic's
limit is dead-lettered whole by the bridge (connectors.pull)."""
DEAD_LETTER_MAX_MESSAGE_BYTES = (
    max(RAW_MAX_MESSAGE_BYTES, PULLED_MAX_MESSAGE_BYTES) + DEAD_LETTER_HEADROOM_BYTES
)
"""A dead letter carries a whole raw delivery (or keyed record, or pulled message too large for
the raw topic) plus the error headers."""
MAX_MESSAGE_BYTES = {
    "raw": RAW_MAX_MESSAGE_BYTES,
    "repartition": EVENT_MAX_MESSAGE_BYTES,
    "dead-letter": DEAD_LETTER_MAX_MESSAGE_BYTES,
    "changelog": EVENT_MAX_MESSAGE_BYTES,
    "output": EVENT_MAX_MESSAGE_BYTES,
    "stale": EVENT_MAX_MESSAGE_BYTES,
}
"""`max.message.bytes` of each role of topic in `topology`."""


def _limit(role: str) -> dict[str, str]:
    return {"max.message.bytes": str(MAX_MESSAGE_BYTES[role])}


RAW_TOPIC_CONFIG = {"retention.ms": str(7 * DAY_MS), **_limit("raw")}
# Output topics keep every event for 7 days, then at least the last event of each key, for
# good: consumers that fall up to a week behind miss nothing, and `connectors reconcile` can
# always tell what the stream last said about a key.
OUTPUT_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": str(7 * DAY_MS),
    **_limit("output"),
}
# A changelog entry may outlive its TTL by this much before the broker may delete it.
MAX_RECORDS_PER_REQUEST = 2_000
"""Metadata records one CreateTopics request may cause (a topic, each of its partitions, each
config it sets): KRaft's controller refuses a request of more than 10,000 at once, every
topic of it with POLICY_VIOLATION "Unable to perform excessively large batch operation" (the
2,006 topics of 1,000 instances are over 16,000). Batches well under it."""
TOPIC_ALREADY_EXISTS = KafkaError.TOPIC_ALREADY_EXISTS
METADATA_TIMEOUT_S = 10.0
"""One metadata or config request answered within this, or Kafka counts as away (retried)."""
CREATE_TIMEOUT_S = 40.0
"""One CreateTopics request, its creation on the controller included."""
UNREACHABLE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError._WAIT_COORD,
    }
)
"""librdkafka's errors for a cluster it could not reach in time (not a refusal)."""
NAMES_SHOWN = 10
"""Topic names a line names before it says how many more."""


class TopicsNotCreated(KafkaAccessError):
    """Kafka refused to create topics (policy, quota, limits, ACLs): waiting would not
    change it; one line naming the first topics and the broker's reason."""


def names_line(names: list[str], shown: int = NAMES_SHOWN) -> str:
    """`a, b, c` or, past `shown` names, `a, b, ... and 1,990 more`."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])}, ... and {len(names) - shown:,} more"


def creation_batches(specs: list[TopicSpec]) -> list[list[TopicSpec]]:
    """`specs` in CreateTopics requests of at most MAX_RECORDS_PER_REQUEST records each."""
    batches: list[list[TopicSpec]] = []
    batch: list[TopicSpec] = []
    records = 0
    for spec in specs:
        size = 1 + spec.partitions + len(spec.config)
        if batch and records + size > MAX_RECORDS_PER_REQUEST:
            batches.append(batch)
            batch, records = [], 0
        batch.append(spec)
        records += size
    if batch:
        batches.append(batch)
    return batches


def _admin(kafka: KafkaSettings) -> AdminClient:
    config: dict[str, Any] = {
        **kafka.librdkafka_config(),
        "client.id": "storage-events-topics",
        "logger": librdkafka_log(),  # its lines through the log, never raw on stderr
    }
    return AdminClient(config)


def _create(admin: AdminClient, specs: list[TopicSpec]) -> list[str]:
    """Create `specs` in batches, one CreateTopics request each (librdkafka sends one call's
    topics in one request); the names this call created. Raise TopicsNotCreated for what
    Kafka refused (each topic's future carries its own error). A topic that exists by now
    (another worker, or one this broker created but did not list yet) is fine.
    Blocking: a thread's."""
    created: list[str] = []
    refused: list[tuple[str, int, str]] = []
    for batch in creation_batches(specs):
        futures = admin.create_topics(
            [
                NewTopic(
                    spec.name, spec.partitions, spec.replication_factor, config=dict(spec.config)
                )
                for spec in batch
            ],
            operation_timeout=CREATE_TIMEOUT_S - 10,
            request_timeout=CREATE_TIMEOUT_S,
        )
        for topic, future in futures.items():
            try:
                try:
                    future.result(CREATE_TIMEOUT_S + 5)
                except concurrent.futures.TimeoutError:
                    raise KafkaException(
                        KafkaError(KafkaError._TIMED_OUT, f"creating {topic}: no answer")
                    ) from None
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() in UNREACHABLE:
                    raise
                if error.code() != TOPIC_ALREADY_EXISTS:
                    refused.append((topic, error.code(), error.str()))
            else:
                created.append(topic)
    if refused:
        reasons = sorted({f"{reason or 'error'} (code {code})" for _, code, reason in refused})
        raise TopicsNotCreated(
            f"Kafka refused to create {len(refused):,} topic(s) "
            f"({names_line([topic for topic, _, _ in refused])}): {'; '.join(reasons)}"
        )
    return created


def _ensure(kafka: KafkaSettings, specs: list[TopicSpec]) -> list[str]:
    """One attempt of `ensure_topics` (blocking: a thread's)."""
    admin = _admin(kafka)
    metadata = admin.list_topics(timeout=METADATA_TIMEOUT_S)
    missing = [spec for spec in specs if spec.name not in metadata.topics]
    created = _create(admin, missing) if missing else []
    _warn_of_lower_limits(admin, metadata, [spec for spec in specs if spec.name in metadata.topics])
    return created


CHANGELOG_RETENTION_MARGIN_MS = 3600 * 1000


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict)
    role: str = ""


def changelog_topic(settings: Settings, table: str) -> str:
    """Faust's name for a table's changelog."""
    return f"{settings.stream.app_id}-{table}-changelog"


def topology(settings: Settings) -> list[TopicSpec]:
    stream = settings.stream
    parts, replicas = stream.partitions, stream.replication_factor
    longest_ttl_ms = int(max(instance.dedupe_ttl for instance in settings.instances) * 1000)
    specs = [
        TopicSpec(raw.name, parts, replicas, RAW_TOPIC_CONFIG, "raw") for raw in stream.raw_topics
    ]
    specs += [
        TopicSpec(
            stream.repartition_topic,
            parts,
            replicas,
            {"retention.ms": str(7 * DAY_MS), **_limit("repartition")},
            "repartition",
        ),
        TopicSpec(
            stream.dead_letter_topic,
            parts,
            replicas,
            # holds raw deliveries as they came, with the error headers
            {"retention.ms": str(30 * DAY_MS), **_limit("dead-letter")},
            "dead-letter",
        ),
        TopicSpec(
            changelog_topic(settings, KEYS_TABLE),
            parts,
            replicas,
            # A live key's record is kept for good (its mark); an ended one is tombstoned.
            {"cleanup.policy": "compact", **_limit("changelog")},
            "changelog",
        ),
        TopicSpec(
            changelog_topic(settings, SEEN_TABLE),
            parts,
            replicas,
            {
                "cleanup.policy": "compact,delete",
                "retention.ms": str(longest_ttl_ms + CHANGELOG_RETENTION_MARGIN_MS),
                **_limit("changelog"),
            },
            "changelog",
        ),
        TopicSpec(
            changelog_topic(settings, MARKS_TABLE),
            parts,
            replicas,
            {"cleanup.policy": "compact", **_limit("changelog")},
            "changelog",
        ),
    ]
    for instance in settings.instances:
        own = instance.partitions or parts
        specs.append(TopicSpec(instance.output_topic, own, replicas, OUTPUT_TOPIC_CONFIG, "output"))
        specs.append(
            TopicSpec(
                instance.stale_output_topic,
                own,
                replicas,
                {"retention.ms": str(30 * DAY_MS), **_limit("stale")},
                "stale",
            )
        )
    # Every topic, internal ones included: a changelog or the repartition topic that took a
    # write from one replica alone could lose it with that broker (the broker's default is 1).
    in_sync = {MIN_INSYNC_REPLICAS: str(stream.min_insync_replicas)}
    return [replace(spec, config={**spec.config, **in_sync}) for spec in specs]


async def ensure_topics(
    kafka: KafkaSettings | str, specs: list[TopicSpec], retry_for_s: float | None = None
) -> list[str]:
    """Create the topics that do not exist yet, in batches (`creation_batches`); return their
    names. TopicsNotCreated when Kafka refuses some (named, with its reason).

    Retries while the broker is unreachable (for `retry_for_s`, or forever when None), so a
    worker started before its broker waits for it instead of failing. A broker that refuses
    the credentials or whose certificate is not trusted raises KafkaAccessError at once
    (naming the setting): waiting would not change it.
    """
    kafka = KafkaSettings.of(kafka)
    problem = await check_access(kafka)  # before a client logs its own lines about it
    if problem is not None and problem[1]:
        raise KafkaAccessError(problem[0])
    delay, waited = 0.5, 0.0
    while True:
        try:
            return await asyncio.to_thread(_ensure, kafka, specs)
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() in UNREACHABLE:
                problem = await check_access(kafka)
                if problem is not None and problem[1]:
                    raise KafkaAccessError(problem[0]) from None
                if retry_for_s is not None and waited >= retry_for_s:
                    if problem is not None:
                        raise KafkaAccessError(problem[0]) from None
                    raise
                log.warning(
                    "Kafka at %s not reachable (%s); retrying in %.1f s",
                    kafka.bootstrap_servers,
                    problem[0] if problem else error.str(),
                    delay,
                )
            else:
                if retry_for_s is not None and waited >= retry_for_s:
                    raise
                log.warning("creating topics failed (%s); retrying in %.1f s", error.str(), delay)
        await asyncio.sleep(delay)
        waited += delay
        delay = min(delay * 2, 5.0)


def _warn_of_lower_limits(
    admin: AdminClient, metadata: ClusterMetadata, specs: list[TopicSpec]
) -> None:
    """Say at start-up which existing topics (created beforehand, or by an older version)
    are weaker than the stream's settings ask, one line each, naming the fix. Nothing is
    changed: a topic's config is its owner's.

    * smaller records (`max.message.bytes`): records over it are dead-lettered (or, on the
      dead-letter topic, written without their value) instead of stopping the stream;
    * fewer replicas than `stream.replication_factor`, or a lower `min.insync.replicas` than
      `stream.min_insync_replicas`: an acknowledged write may live on fewer brokers than
      configured, and be lost with them."""
    if not specs:
        return
    _warn_of_fewer_replicas(metadata, specs)
    names = {"max.message.bytes", MIN_INSYNC_REPLICAS}
    wanted = {
        (spec.name, name): int(spec.config[name])
        for spec in specs
        for name in names
        if name in spec.config
    }
    if not wanted:
        return
    found_configs: dict[str, dict[str, str]] = {}
    try:
        futures = admin.describe_configs(
            [ConfigResource(RdResourceType.TOPIC, spec.name) for spec in specs],
            request_timeout=METADATA_TIMEOUT_S,
        )
        for resource, future in futures.items():
            entries = future.result(METADATA_TIMEOUT_S + 5)
            found_configs[resource.name] = {
                name: entry.value for name, entry in entries.items() if name in names
            }
    except (KafkaException, concurrent.futures.TimeoutError) as exc:
        log.debug("could not read the topics' configs: %r", exc)
        return
    for topic, configs in found_configs.items():
        for name, value in configs.items():
            limit = wanted.get((topic, name))
            if limit is None:
                continue
            with contextlib.suppress(TypeError, ValueError):
                found = int(value)
                if found >= limit:
                    continue
                if name == MIN_INSYNC_REPLICAS:
                    log.warning(
                        "topic %s has min.insync.replicas=%d, the stream asks for %d "
                        "(stream.min_insync_replicas): a write is acknowledged with fewer "
                        "copies; raise it with kafka-configs --alter --add-config "
                        "min.insync.replicas=%d",
                        topic,
                        found,
                        limit,
                        limit,
                    )
                else:
                    log.warning(
                        "topic %s takes records of at most %d bytes (max.message.bytes), "
                        "the stream writes up to %d: larger ones are dead-lettered; raise "
                        "it with kafka-configs --alter --add-config max.message.bytes=%d",
                        topic,
                        found,
                        limit,
                        limit,
                    )


def _warn_of_fewer_replicas(metadata: ClusterMetadata, specs: list[TopicSpec]) -> None:
    """One line per existing topic with fewer replicas than its spec (its least partition),
    from the metadata `ensure_topics` read anyway."""
    for spec in specs:
        topic = metadata.topics.get(spec.name)
        if topic is None or topic.error is not None or not topic.partitions:
            continue
        found = min(len(partition.replicas) for partition in topic.partitions.values())
        if found < spec.replication_factor:
            log.warning(
                "topic %s has %d replica(s), the stream asks for %d (stream.replication_factor): "
                "it is lost with fewer brokers than configured; add replicas with "
                "kafka-reassign-partitions",
                spec.name,
                found,
                spec.replication_factor,
            )


async def resolve_repartition_topic(settings: Settings) -> Settings:
    """The settings with the repartition topic this app's worker must use: the per-app
    default `<app_id>.by-key`, unless the configuration names none and the app's emit group
    still reads `storage-events.by-key` (a deployment of another app id from before
    2026-12): then that one, so that nothing waiting in it is lost, with a warning saying how
    to move (docs/upgrading.md). The default app id's topic is the same name either way."""
    stream = settings.stream
    if stream.repartition_topic_chosen or stream.repartition_topic == LEGACY_REPARTITION_TOPIC:
        return settings
    delay = 0.5
    while True:
        try:
            read = await committed_topics(
                settings.kafka, f"{stream.app_id}-emit", [LEGACY_REPARTITION_TOPIC]
            )
            break
        except OffsetsUnavailable as exc:  # Kafka away at start: wait for it, as ensure_topics does
            log.warning(
                "reading the emit group's committed offsets failed (%s); retrying in %.1f s",
                exc,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
    if LEGACY_REPARTITION_TOPIC not in read:
        return settings
    log.warning(
        "the emit group %s-emit reads %s, the repartition topic every app shared before "
        "2026-12: keeping it, so nothing waiting there is lost (the default is now %s, per "
        "app); set stream.repartition_topic to choose (docs/upgrading.md)",
        stream.app_id,
        LEGACY_REPARTITION_TOPIC,
        stream.repartition_topic,
    )
    kept = stream.model_copy(update={"repartition_topic": LEGACY_REPARTITION_TOPIC})
    return settings.model_copy(update={"stream": kept})
