"""Leaving the consumer groups for good: a static member removed by its group.instance.id.

Static membership (KIP-345, `STREAMS_GROUP_INSTANCE_ID`) is for restarts: a static member
sends no LeaveGroup when it closes (aiokafka 0.14 `GroupCoordinator._maybe_leave_group` skips
it when `group_instance_id` is set, as the Java client does), so a restarted worker takes its
partitions back without a rebalance. A worker that is NOT coming back (a scale-in) would then
leave its partitions unowned for the whole session timeout. So a worker told it is leaving
for good (`STREAMS_LEAVE_GROUP_ON_STOP=true`, or SIGUSR1: streams.worker) removes itself from
its groups once its consumers have closed, and an operator can remove a named member that
died (`python -m streams remove-member --instance-id NAME`).

The removal is LeaveGroup v3+ (KIP-345): its `members` list names the member by
`group_instance_id` with an unknown (empty) member id, which the coordinator accepts for a
static member, as the Java admin client's `removeMembersFromConsumerGroup` does. aiokafka
0.14 speaks LeaveGroup v0-v1 only (one member id, no instance id), and confluent-kafka has no
such call, so v3 is declared in streams.engine.protocol (LeaveGroupRequest.json /
LeaveGroupResponse.json of the Kafka clients; v3 is the last non-flexible version; Kafka 4.4
answers v0-v5).

Which member a worker is in which group (streams.worker): `<app_id>-normalize` as
`<instance id>-normalize`, `<app_id>-emit` as `<instance id>-emit`, and Faust's own group
`<app_id>` as `<instance id>`.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.client import AIOKafkaClient, CoordinationType  # LeaveGroup v3: no librdkafka call
from aiokafka.errors import KafkaError, for_code
from confluent_kafka.admin import AdminClient

from streams.engine.protocol import LeaveStaticMembers
from streams.kafka_settings import KafkaSettings

UNKNOWN_MEMBER_ID_CODE = 25
"""The member is not in the group (or the group does not exist)."""
FENCED_INSTANCE_ID_CODE = 82
"""Another member id holds the instance id (the member came back in the meantime)."""


@dataclass(frozen=True, slots=True)
class Removal:
    """What the coordinator said about one static member of one group."""

    group_id: str
    instance_id: str
    outcome: str
    """"removed", "not a member" (not in the group, or no such group), or an error's name"""

    @property
    def removed(self) -> bool:
        return self.outcome == "removed"


def worker_members(app_id: str, instance_id: str) -> list[tuple[str, str]]:
    """(group id, group.instance.id) of every group a worker started with
    `STREAMS_GROUP_INSTANCE_ID=instance_id` is a static member of (streams.worker)."""
    return [
        (f"{app_id}-normalize", f"{instance_id}-normalize"),
        (f"{app_id}-emit", f"{instance_id}-emit"),
        (app_id, instance_id),
    ]


def outcome_of(error_code: int) -> str:
    """A member's (or the request's) error code in the words `Removal.outcome` uses."""
    if error_code == 0:
        return "removed"
    if error_code == UNKNOWN_MEMBER_ID_CODE:
        return "not a member"
    if error_code == FENCED_INSTANCE_ID_CODE:
        return "fenced (the instance id is in use by a running member)"
    return str(for_code(error_code).__name__)


async def remove_static_members(
    kafka: KafkaSettings | str, members: Sequence[tuple[str, str]], timeout_ms: int = 10_000
) -> list[Removal]:
    """Remove each (group id, group.instance.id) from its group; one LeaveGroup per group,
    sent to the group's coordinator. Kafka errors other than a member's own are raised."""
    kafka = KafkaSettings.of(kafka)
    by_group: dict[str, list[str]] = {}
    for group_id, instance_id in members:
        by_group.setdefault(group_id, []).append(instance_id)
    client = AIOKafkaClient(
        **kafka.aiokafka_args(),
        client_id="storage-events-membership",
        request_timeout_ms=timeout_ms,
    )
    await client.bootstrap()
    try:
        removals: list[Removal] = []
        for group_id, instance_ids in by_group.items():
            coordinator = await client.coordinator_lookup(CoordinationType.GROUP, group_id)
            response = await client.send(coordinator, LeaveStaticMembers(group_id, instance_ids))
            if response.error_code and response.error_code != UNKNOWN_MEMBER_ID_CODE:
                raise for_code(response.error_code)(f"LeaveGroup of group {group_id}")
            answered = {instance: code for _member, instance, code in response.members}
            for instance_id in instance_ids:
                code = answered.get(instance_id, response.error_code or UNKNOWN_MEMBER_ID_CODE)
                removals.append(Removal(group_id, instance_id, outcome_of(code)))
        return removals
    finally:
        await client.close()


async def leave_for_good(
    kafka: KafkaSettings | str, app_id: str, instance_id: str, include_app_group: bool = True
) -> list[Removal]:
    """Remove worker `instance_id` from its stage groups (and Faust's group unless
    `include_app_group` is false); a group that cannot be reached is reported, not raised."""
    members = worker_members(app_id, instance_id)
    if not include_app_group:
        members = members[:2]
    try:
        return await remove_static_members(kafka, members)
    except (KafkaError, NotImplementedError, OSError) as exc:
        return [Removal(group, instance, f"failed: {exc!r}") for group, instance in members]


async def remove_predecessor(
    kafka: KafkaSettings, group_id: str, instance_id: str, timeout_s: float = 15.0
) -> Removal:
    """Remove the static member `instance_id` of `group_id` that a killed predecessor of this
    very member left behind, so that this one can join now (streams.engine.librdkafka.
    consumer: a KIP-848 member restarted under its id is refused UNRELEASED_INSTANCE_ID
    until the old one's session times out, 45 s at least).

    Safe because a group.instance.id is exclusive to one running worker by construction
    (`STREAMS_GROUP_INSTANCE_ID`, a StatefulSet pod name): the member holding it is a
    previous life of this worker. Were a second live worker to share the id, it would be
    fenced anyway: its emit member's transactional.id (`<app id>-emit-<instance id>`) is this
    one's, initialised when this worker started.

    The coordinator accepts it for a consumer-protocol member since Kafka 4.0 (KAFKA-18188:
    GroupMetadataManager.classicGroupLeaveToConsumerGroup no longer requires the member to
    speak the classic protocol) and fences it: the member is removed, the group epoch
    bumped, its partitions assignable at once. Kafka 3.7-3.9 answer UNKNOWN_MEMBER_ID for
    such a member ("not a member" here). Failures are reported, never raised."""
    try:
        [removal] = await asyncio.wait_for(
            remove_static_members(kafka, [(group_id, instance_id)]), timeout_s
        )
    except (KafkaError, NotImplementedError, OSError, TimeoutError) as exc:
        return Removal(group_id, instance_id, f"failed: {exc!r}")
    return removal


class Departure:
    """Whether this worker leaves its groups for good when it stops, and the leaving itself.

    Set from the start (`stream.leave_group_on_stop`) or by SIGUSR1 (`on_signal`: leave, and
    stop as SIGTERM does). The stage groups are left once the stage consumers have closed
    (their last offsets committed, streams.worker.Pipeline.stop); Faust's group at process
    exit (`atexit`), after Faust closed its consumer: a removed member whose consumer still
    runs would only rejoin."""

    def __init__(
        self,
        kafka: KafkaSettings,
        app_id: str,
        instance_id: str | None,
        leaving: bool,
        log: logging.Logger,
    ) -> None:
        self.kafka, self.app_id, self.instance_id = kafka, app_id, instance_id
        self.leaving = leaving and instance_id is not None
        """A dynamic member (no instance id) leaves its groups on close anyway (aiokafka)."""
        self.log = log

    def on_signal(self) -> None:
        """SIGUSR1: stop, and leave the groups for good."""
        self.log.info("SIGUSR1: stopping and leaving the consumer groups for good")
        self.leaving = self.instance_id is not None
        os.kill(os.getpid(), signal.SIGTERM)

    async def leave_stage_groups(self) -> None:
        if not self.leaving or self.instance_id is None:
            return
        started = time.monotonic()
        removals = await leave_for_good(
            self.kafka, self.app_id, self.instance_id, include_app_group=False
        )
        self._report(removals, time.monotonic() - started)
        atexit.register(self._leave_app_group)

    def _leave_app_group(self) -> None:
        assert self.instance_id is not None
        members = worker_members(self.app_id, self.instance_id)[2:]

        async def leave() -> list[Removal]:
            try:
                return await asyncio.wait_for(remove_static_members(self.kafka, members), 5.0)
            except (KafkaError, NotImplementedError, OSError, TimeoutError) as exc:
                return [Removal(group, instance, f"failed: {exc!r}") for group, instance in members]

        self._report(asyncio.run(leave()), None)

    def _report(self, removals: list[Removal], seconds: float | None) -> None:
        for removal in removals:
            level = logging.WARNING if removal.outcome.startswith("failed") else logging.INFO
            self.log.log(
                level,
                "left group %s for good (static member %s): %s%s",
                removal.group_id,
                removal.instance_id,
                removal.outcome,
                "" if seconds is None else f" in {seconds * 1000:.0f} ms",
            )


@dataclass(frozen=True, slots=True)
class GroupView:
    """A consumer group as its coordinator describes it now (either group protocol)."""

    state: str
    """classic: Stable, PreparingRebalance, CompletingRebalance, Empty, Dead; a KIP-848
    consumer group may show Unknown for its own states (librdkafka 2.12)"""
    protocol: str
    """"classic" or "consumer" (KIP-848)"""
    owners: dict[str, list[tuple[str, int]]]
    """member (its group.instance.id, else its member id) -> its (topic, partition)s"""

    def owner_of(self) -> dict[tuple[str, int], str]:
        """Who processes each partition now: nobody while a classic group rebalances (an
        eager rebalance revokes everything); a consumer group's members keep theirs."""
        if self.protocol == "classic" and self.state != "Stable":
            return {}
        return {tp: member for member, tps in self.owners.items() for tp in tps}


def describe(admin: AdminClient, group_id: str, timeout_s: float = 5.0) -> Any:
    """confluent-kafka's ConsumerGroupDescription of `group_id` (blocking)."""
    found = admin.describe_consumer_groups([group_id], request_timeout=timeout_s)
    return found[group_id].result(timeout=timeout_s)


def state_name(described: Any) -> str:
    """A description's state as Kafka names it (Stable, PreparingRebalance, ..., Empty)."""
    name = str(described.state.name)
    return {
        "STABLE": "Stable",
        "PREPARING_REBALANCING": "PreparingRebalance",
        "COMPLETING_REBALANCING": "CompletingRebalance",
        "EMPTY": "Empty",
        "DEAD": "Dead",
    }.get(name, name.title())


def describe_group(admin: AdminClient, group_id: str, timeout_s: float = 5.0) -> GroupView:
    """The members and current assignment of `group_id` (confluent-kafka's admin client:
    ConsumerGroupDescribe for a KIP-848 group, DescribeGroups for a classic one). aiokafka's
    DescribeGroups answers "Dead" for a KIP-848 group. A group with another protocol type
    (Faust's own group) shows its members with no partitions."""
    described = describe(admin, group_id, timeout_s)
    kind = getattr(described, "type", None)
    protocol = "consumer" if kind is not None and kind.name == "CONSUMER" else "classic"
    state = state_name(described)
    owners: dict[str, list[tuple[str, int]]] = {}
    for member in described.members:
        assignment = member.assignment.topic_partitions if member.assignment else []
        owners[member.group_instance_id or member.member_id] = [
            (tp.topic, tp.partition) for tp in assignment
        ]
    return GroupView(state, protocol, owners)


def admin_client(kafka: KafkaSettings | str) -> AdminClient:
    """A confluent-kafka admin client for `describe_group`; its lines go through logging
    (librdkafka would write raw `%6|...|BGQUEUE|...` lines to stderr)."""
    from streams.engine.librdkafka import librdkafka_log

    config: dict[str, Any] = {
        **KafkaSettings.of(kafka).librdkafka_config(),
        "logger": librdkafka_log(),
    }
    return AdminClient(config)
