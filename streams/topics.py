"""Every topic the stream uses, with its partitions and policies, created at start-up.

One list (`topology`) serves the worker's start-up, `python -m streams create-topics`, and
the Kubernetes `KafkaTopic` manifests' checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError

from streams.config import Settings

log = logging.getLogger(__name__)

DAY_MS = 24 * 3600 * 1000
SEEN_TABLE = "seen"
MARKS_TABLE = "marks"
# A delivery may be as large as the webhook's body limit (1 MiB by default) plus its headers,
# over Kafka's 1 MiB default; the bridges' producers allow the same.
RAW_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
RAW_TOPIC_CONFIG = {
    "retention.ms": str(7 * DAY_MS),
    "max.message.bytes": str(RAW_MAX_MESSAGE_BYTES),
}
# Output topics keep every event for 7 days, then at least the last event of each key, for
# good: consumers that fall up to a week behind miss nothing, and `connectors reconcile` can
# always tell what the stream last said about a key.
OUTPUT_TOPIC_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(7 * DAY_MS)}
# A changelog entry may outlive its TTL by this much before the broker may delete it.
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
            {"retention.ms": str(7 * DAY_MS)},
            "repartition",
        ),
        TopicSpec(
            stream.dead_letter_topic,
            parts,
            replicas,
            # holds raw deliveries as they came, as large as the raw topic's
            {"retention.ms": str(30 * DAY_MS), "max.message.bytes": str(RAW_MAX_MESSAGE_BYTES)},
            "dead-letter",
        ),
        TopicSpec(
            changelog_topic(settings, SEEN_TABLE),
            parts,
            replicas,
            {
                "cleanup.policy": "compact,delete",
                "retention.ms": str(longest_ttl_ms + CHANGELOG_RETENTION_MARGIN_MS),
            },
            "changelog",
        ),
        TopicSpec(
            changelog_topic(settings, MARKS_TABLE),
            parts,
            replicas,
            {"cleanup.policy": "compact"},
            "changelog",
        ),
    ]
    for instance in settings.instances:
        specs.append(
            TopicSpec(instance.output_topic, parts, replicas, OUTPUT_TOPIC_CONFIG, "output")
        )
        specs.append(
            TopicSpec(
                instance.stale_output_topic,
                parts,
                replicas,
                {"retention.ms": str(30 * DAY_MS)},
                "stale",
            )
        )
    return specs


async def ensure_topics(
    bootstrap_servers: str, specs: list[TopicSpec], retry_for_s: float | None = None
) -> list[str]:
    """Create the topics that do not exist yet; return their names.

    Retries while the broker is unreachable (for `retry_for_s`, or forever when None), so a
    worker started before its broker waits for it instead of failing.
    """
    delay, waited = 0.5, 0.0
    while True:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap_servers, client_id="storage-events-topics"
        )
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            missing = [spec for spec in specs if spec.name not in existing]
            if missing:
                with contextlib.suppress(TopicAlreadyExistsError):  # another worker was first
                    await admin.create_topics(
                        [
                            NewTopic(
                                spec.name,
                                spec.partitions,
                                spec.replication_factor,
                                topic_configs=spec.config,
                            )
                            for spec in missing
                        ]
                    )
            return [spec.name for spec in missing]
        except KafkaConnectionError as exc:
            if retry_for_s is not None and waited >= retry_for_s:
                raise
            log.warning(
                "Kafka at %s not reachable (%s); retrying in %.1f s", bootstrap_servers, exc, delay
            )
        except KafkaError as exc:
            if retry_for_s is not None and waited >= retry_for_s:
                raise
            log.warning("creating topics failed (%r); retrying in %.1f s", exc, delay)
        finally:
            await admin.close()
        await asyncio.sleep(delay)
        waited += delay
        delay = min(delay * 2, 5.0)
