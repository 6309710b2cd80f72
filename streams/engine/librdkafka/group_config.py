"""The stage groups' own timing under KIP-848 (`group.protocol=consumer`).

With the classic protocol a member tells the coordinator its session timeout and heartbeat
interval; under KIP-848 they are the group's, set on the broker: its defaults
(`group.consumer.session.timeout.ms` 45 s, `group.consumer.heartbeat.interval.ms` 5 s), or a
group config (KIP-848's dynamic group configs, `consumer.session.timeout.ms` and
`consumer.heartbeat.interval.ms` on the GROUP resource). So the worker sets its stage groups'
configs at start from `stream.session_timeout_s`: a worker that vanishes gives its partitions
up after the session timeout it was configured with, and a membership change reaches the other
members at their next heartbeat (HEARTBEAT_S), not up to 5 s later.

The broker bounds both (`group.consumer.min.session.timeout.ms`, 45 s by default, and
`group.consumer.min.heartbeat.interval.ms`, 5 s, with their maxima): a value outside them is
refused, the refusal is logged once with the broker's allowed range and the setting to
change, and the group keeps what it has. Needs ALTER_CONFIGS on the groups (`python -m
streams acls` grants it); without it, the same warning and the broker's defaults.

A cluster before Kafka 4.0 has no KIP-848 groups (3.7-3.9 only with it enabled): its brokers
offer no ConsumerGroupHeartbeat, and librdkafka would retry that call for good, the worker
never assigned anything. A 4.x cluster can have them switched off: the `group.version` feature
not finalized (a cluster upgraded from 3.x keeps it at 0 until `kafka-features.sh upgrade`), in
which case its brokers still offer the API but answer it UNSUPPORTED_VERSION, a fatal error
librdkafka raises at every join. So the worker asks every broker's ApiVersions at start (v3:
the API keys and the finalized features) and stops (exit 2) naming `STREAMS_GROUP_PROTOCOL`
when one lacks either (`kip848_refusal`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any

from aiokafka.client import AIOKafkaClient  # ApiVersions v3 (features): no librdkafka call
from aiokafka.protocol.admin import ApiVersionRequest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from streams.engine.librdkafka import librdkafka_log
from streams.engine.protocol import FEATURES, FINALIZED_FEATURES_TAG, ApiVersionsV3
from streams.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
"""The heartbeat interval asked for: how soon a member learns of an assignment change."""
CALL_TIMEOUT_S = 15.0

BROKER_SETTING = {
    "consumer.session.timeout.ms": "group.consumer.min.session.timeout.ms",
    "consumer.heartbeat.interval.ms": "group.consumer.min.heartbeat.interval.ms",
}
"""Per group config, the broker setting that bounds it from below."""


def wanted(session_timeout_s: float) -> dict[str, str]:
    """The group configs for a session timeout: the heartbeat at most a fifth of it."""
    heartbeat_s = min(HEARTBEAT_S, session_timeout_s / 5)
    return {
        "consumer.session.timeout.ms": str(int(session_timeout_s * 1000)),
        "consumer.heartbeat.interval.ms": str(int(heartbeat_s * 1000)),
    }


def _set(admin: AdminClient, group: str, name: str, value: str) -> str | None:
    """Set one group config (each alone: the broker refuses a request as a whole); None, or
    why it was refused."""
    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    try:
        for future in admin.incremental_alter_configs(
            [resource], request_timeout=CALL_TIMEOUT_S
        ).values():
            future.result(CALL_TIMEOUT_S)
    except KafkaException as exc:
        return str(exc.args[0].str() if exc.args else exc)
    except Exception as exc:  # a timeout (concurrent.futures) or a client error
        return repr(exc)
    return None


def configure(kafka: KafkaSettings, groups: Iterable[str], session_timeout_s: float) -> list[str]:
    """Set `groups`' session timeout and heartbeat (blocking: run it off the event loop);
    the refusals, each as a log line says it."""
    # Its lines through logging, never librdkafka's raw `%6|...` lines on stderr.
    config: dict[str, Any] = {**kafka.librdkafka_config(), "logger": librdkafka_log()}
    admin = AdminClient(config)
    refusals: list[str] = []
    for group in groups:
        for name, value in wanted(session_timeout_s).items():
            refused = _set(admin, group, name, value)
            if refused is not None:
                refusals.append(
                    f"group {group}: {name}={value} refused ({refused}); the group keeps the "
                    f"broker's (lower the broker's {BROKER_SETTING[name]} to allow it)"
                )
    return refusals


async def configure_stage_groups(
    kafka: KafkaSettings, groups: Iterable[str], session_timeout_s: float
) -> None:
    """`configure`, logging what the broker refused (the worker goes on either way)."""
    for refusal in await asyncio.to_thread(configure, kafka, list(groups), session_timeout_s):
        log.warning("KIP-848 group config: %s", refusal)


CONSUMER_GROUP_HEARTBEAT = 68
"""KIP-848's ConsumerGroupHeartbeat API key."""


GROUP_VERSION = "group.version"
"""The feature that switches KIP-848 groups on (1 and above; Kafka 4.0's default for a new
cluster)."""


@dataclass(frozen=True)
class BrokerVersions:
    """What one broker's ApiVersions answer says: its API keys and, where the answer carries
    them (v3 and newer), the cluster's finalized features (name -> max version level)."""

    api_keys: set[int]
    features: dict[str, int] | None = field(default=None)


def finalized_features(tags: dict[int, bytes]) -> dict[str, int]:
    """The finalized features of an ApiVersions v3+ answer's tagged fields (none: {})."""
    raw = tags.get(FINALIZED_FEATURES_TAG)
    if raw is None:
        return {}
    return {name: level for name, level, _, _ in FEATURES.decode(BytesIO(raw)) or []}


async def _versions(client: AIOKafkaClient, node_id: int) -> BrokerVersions:
    try:
        response = await client.send(node_id, ApiVersionsV3())
    except NotImplementedError:  # a broker older than 2.4 (no v3): no features, no KIP-848
        response = None
    if response is None or response.error_code != 0:  # v3 refused: its list may be empty
        old = await client.send(node_id, ApiVersionRequest())
        return BrokerVersions({key for key, _, _ in old.api_versions})
    return BrokerVersions(
        {key for key, _, _, _ in response.api_keys}, finalized_features(response.tags)
    )


async def versions_by_broker(kafka: KafkaSettings) -> dict[str, BrokerVersions]:
    """Per broker (`host:port`), what its ApiVersions answer offers."""
    client = AIOKafkaClient(**kafka.aiokafka_args(), client_id="storage-events-api-versions")
    await client.bootstrap()
    try:
        return {
            f"{broker.host}:{broker.port}": await _versions(client, broker.nodeId)
            for broker in client.cluster.brokers()
        }
    finally:
        await client.close()


def kip848_refusal(versions: Mapping[str, BrokerVersions]) -> str | None:
    """Why `group.protocol=consumer` cannot work on these brokers, naming the setting that
    fixes it; None when every one offers ConsumerGroupHeartbeat with KIP-848 groups on."""
    fix = 'set STREAMS_GROUP_PROTOCOL=classic (or [stream] group_protocol = "classic"), or '
    lacking = sorted(
        broker for broker, seen in versions.items() if CONSUMER_GROUP_HEARTBEAT not in seen.api_keys
    )
    if lacking:
        return (
            'stream.group_protocol is "consumer" (KIP-848, the default), which needs Kafka 4.0 '
            f"or newer, and broker {', '.join(lacking)} offers no ConsumerGroupHeartbeat: "
            f"{fix}upgrade the cluster"
        )
    off = sorted(
        broker
        for broker, seen in versions.items()
        if seen.features is not None and seen.features.get(GROUP_VERSION, 0) < 1
    )
    if off:
        return (
            'stream.group_protocol is "consumer" (KIP-848, the default), and the cluster has '
            f"KIP-848 groups switched off (broker {', '.join(off)}: feature {GROUP_VERSION} not "
            f"finalized, as after an upgrade from 3.x): {fix}enable them with "
            f"`kafka-features.sh --bootstrap-server ... upgrade --feature {GROUP_VERSION}=1`"
        )
    return None
