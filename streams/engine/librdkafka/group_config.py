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
never assigned anything. So the worker asks every broker's ApiVersions at start and stops
(exit 2) naming `STREAMS_GROUP_PROTOCOL` when one lacks it (`kip848_refusal`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.admin import ApiVersionRequest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

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
    admin = AdminClient(kafka.librdkafka_config())
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


async def api_keys_by_broker(kafka: KafkaSettings) -> dict[str, set[int]]:
    """Per broker (`host:port`), the API keys its ApiVersions answer offers."""
    client = AIOKafkaClient(**kafka.aiokafka_args(), client_id="storage-events-api-versions")
    await client.bootstrap()
    try:
        keys: dict[str, set[int]] = {}
        for broker in client.cluster.brokers():
            response = await client.send(broker.nodeId, ApiVersionRequest())
            keys[f"{broker.host}:{broker.port}"] = {key for key, _, _ in response.api_versions}
        return keys
    finally:
        await client.close()


def kip848_refusal(keys_by_broker: Mapping[str, set[int]]) -> str | None:
    """Why `group.protocol=consumer` cannot work on these brokers, naming the setting that
    fixes it; None when every one offers ConsumerGroupHeartbeat."""
    lacking = sorted(
        broker for broker, keys in keys_by_broker.items() if CONSUMER_GROUP_HEARTBEAT not in keys
    )
    if not lacking:
        return None
    return (
        'stream.group_protocol is "consumer" (KIP-848, the default), which needs Kafka 4.0 or '
        f"newer, and broker {', '.join(lacking)} offers no ConsumerGroupHeartbeat: set "
        'STREAMS_GROUP_PROTOCOL=classic (or [stream] group_protocol = "classic"), or upgrade '
        "the cluster"
    )
