"""What an operator sees of the stream's progress: `python -m streams status` and the worker's
progress line.

The status view reads the truth from where it lives, so that it cannot disagree with it:

* per stage group (`<app_id>-normalize`, `<app_id>-emit`): its members and each partition's
  owner (Kafka's group description), committed offsets (the group's offsets) against the
  input topics' end offsets (`read_committed`), and their difference, the lag;
* restore progress: only the worker knows how far its restore got, so it comes from each
  worker's `/ready` JSON (`stages.emit.restore`: restoring since when, or restored how many
  changelog records in how long), next to the changelogs' sizes from Kafka;
* per instance: the time of the last event (the newest record on its output topic) and
  events/s (the workers' `storage_events_emitted_total`, between two reads of `/metrics`).
  At most `SHOWN_INSTANCES` of them (issue 33: each costs a read of its output topic): with
  more, the ones that emitted most, and a count of the others. Workers that aggregate their
  instances' metrics (`stream.instance_metrics_limit`) give no per-instance events/s: one
  row `*` has them all. Beside them, the duplicates dropped and the stale events (the
  workers' `storage_events_duplicates_total`, `storage_events_stale_total`), and one line of
  dead letters (`storage_events_dead_lettered_total`): counts since the workers started, which
  only the workers know (a duplicate is written nowhere).

`snapshot` does the I/O; `render` and `progress_line` are pure.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
)
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec
from prometheus_client.parser import text_string_to_metric_families

from streams.config import InstanceConfig, Settings
from streams.engine.membership import describe, state_name
from streams.engine.records import TopicPartition
from streams.engine.topics import KEYS_TABLE, MARKS_TABLE, SEEN_TABLE, changelog_topic
from streams.kafka_settings import KafkaSettings
from streams.reader import silent_log

LAST_RECORDS = 4
"""Offsets read back from each output partition's end to find its newest event: a
transaction's commit marker takes an offset too, so the last one may be no record."""
HTTP_TIMEOUT_S = 2.0
SHOWN_INSTANCES = 50
"""The most instances the status view lists (module docstring)."""
AGGREGATE = "*"
"""The `instance` label of metrics aggregated over every instance (streams.metrics)."""
STAGES = ("normalize", "emit")
SampleReader = Callable[[str, dict[str, str]], float | None]
"""A sample's value by its name and labels (None: no such sample)."""


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    client_id: str
    """Its group instance id when static (KIP-848 member ids are random: the name to show)."""
    host: str
    partitions: tuple[str, ...]
    """`topic[partition]` it owns."""


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    owner: str | None
    """The owning member's id, None when nobody has it (no worker, or a rebalance)."""
    committed: int | None
    """The group's committed offset; None before its first commit."""
    end: int
    lag: int


@dataclass(frozen=True, slots=True)
class GroupStatus:
    name: str
    state: str
    """Kafka's group state: Stable, PreparingRebalance, CompletingRebalance, Empty, Dead."""
    members: tuple[Member, ...]
    partitions: tuple[PartitionLag, ...]

    @property
    def lag(self) -> int:
        return sum(row.lag for row in self.partitions)


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    name: str
    topic: str
    records: int | None
    """Offsets on the output topic (records and commit markers); None when it is missing."""
    last_event_at: float | None
    """The newest record's timestamp (s since the epoch), None when there is none."""
    emitted: float | None
    """`storage_events_emitted_total` summed over the workers answering; None if none does."""
    events_per_s: float | None
    duplicates: float | None = None
    """`storage_events_duplicates_total` (ids seen within the TTL, dropped), as `emitted`."""
    stale: float | None = None
    """`storage_events_stale_total` (older than what was emitted, to the stale topic)."""


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    url: str
    ready: bool | None
    """None when it did not answer."""
    error: str | None
    stages: Mapping[str, Any] = field(default_factory=dict)
    """Its `/ready` JSON's stages (the emit stage's carries `restore`)."""
    counts: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Its /metrics' OUTCOMES: per counter, per instance (dead letters: per stage)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    bootstrap: str
    taken_at: float
    groups: tuple[GroupStatus, ...]
    changelogs: Mapping[str, int]
    """Per changelog topic: offsets it holds over all partitions (what a full restore reads)."""
    instances: tuple[InstanceStatus, ...]
    workers: tuple[WorkerStatus, ...]
    emitted_at: float | None = None
    """When `instances[*].emitted` was read (for the next snapshot's rates)."""
    more_instances: int = 0
    """Configured instances not listed (over SHOWN_INSTANCES)."""
    dead_letters: float | None = None
    """`storage_events_dead_lettered_total` over every stage of the workers answering (since
    they started); None when none does."""
    dead_letter_topic: str = "files.dead-letter"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for group, status in zip(data["groups"], self.groups, strict=True):
            group["lag"] = status.lag
        return data


def lag_of(committed: int | None, beginning: int, end: int) -> int:
    """Records the group has still to read: from its committed offset (or from the topic's
    beginning, where `auto_offset_reset=earliest` starts it) to the end."""
    start = beginning if committed is None or committed < beginning else committed
    return max(0, end - start)


OUTCOMES = {
    "duplicates": ("storage_events_duplicates", "instance"),
    "stale": ("storage_events_stale", "instance"),
    "dead_letters": ("storage_events_dead_lettered", "stage"),
}
"""What the status view counts besides emitted events: its name, the worker's counter and the
label it is split by (issue 35: a duplicate, a stale event or a dead letter is visible)."""


def outcome_totals(metrics_text: str) -> dict[str, dict[str, float]]:
    """Per OUTCOMES name, its counter's `_total` per label value, from a `/metrics` text."""
    wanted = {f"{family}_total": (name, label) for name, (family, label) in OUTCOMES.items()}
    totals: dict[str, dict[str, float]] = {name: {} for name in OUTCOMES}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in wanted:
                name, label = wanted[sample.name]
                key = sample.labels.get(label, "")
                totals[name][key] = totals[name].get(key, 0.0) + sample.value
    return totals


def summed_counts(workers: Iterable[WorkerStatus]) -> dict[str, dict[str, float]] | None:
    """The workers' OUTCOMES added up; None when no worker gave its metrics."""
    summed: dict[str, dict[str, float]] | None = None
    for worker in workers:
        if not worker.counts:
            continue
        summed = summed or {name: {} for name in OUTCOMES}
        for name, values in worker.counts.items():
            for key, value in values.items():
                summed[name][key] = summed[name].get(key, 0.0) + value
    return summed


def emitted_totals(metrics_text: str) -> dict[str, float]:
    """`storage_events_emitted_total` per instance from a worker's `/metrics` text."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "storage_events_emitted":
            continue
        for sample in family.samples:
            if sample.name == "storage_events_emitted_total":
                instance = sample.labels.get("instance", "")
                totals[instance] = totals.get(instance, 0.0) + sample.value
    return totals


async def _http_get(url: str) -> tuple[int, str]:
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
        return response.status, await response.text()


async def _worker(url: str) -> tuple[WorkerStatus, dict[str, float] | None]:
    base = url.rstrip("/")
    try:
        _, ready_text = await _http_get(f"{base}/ready")
        status, metrics_text = await _http_get(f"{base}/metrics")
        body = json.loads(ready_text)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        # ValueError: not the worker's JSON (another service on that port)
        return WorkerStatus(url, None, f"no answer ({exc.__class__.__name__})"), None
    totals = emitted_totals(metrics_text) if status == 200 else None
    counts = outcome_totals(metrics_text) if status == 200 else {}
    return (
        WorkerStatus(url, bool(body.get("ready")), None, dict(body.get("stages") or {}), counts),
        totals,
    )


def shown_instances(
    instances: Sequence[InstanceConfig],
    totals: Mapping[str, float] | None,
    most: int = SHOWN_INSTANCES,
) -> list[InstanceConfig]:
    """Every instance when there are at most `most`; else the `most` that emitted most (by
    the workers' `totals`; configuration order between equals, and when nothing is known),
    in configuration order."""
    if len(instances) <= most:
        return list(instances)
    known = totals or {}
    ranked = sorted(range(len(instances)), key=lambda i: (-known.get(instances[i].name, 0.0), i))
    return [instances[i] for i in sorted(ranked[:most])]


async def workers_emitted(
    urls: Sequence[str],
) -> tuple[list[WorkerStatus], dict[str, float] | None, float]:
    """Each worker's state and the emitted totals summed over those that answered."""
    answers = await asyncio.gather(*(_worker(url) for url in urls))
    read_at = time.time()
    summed: dict[str, float] | None = None
    for _, totals in answers:
        if totals is None:
            continue
        summed = summed or {}
        for instance, value in totals.items():
            summed[instance] = summed.get(instance, 0.0) + value
    return [worker for worker, _ in answers], summed, read_at


CALL_TIMEOUT_S = 10.0
"""One request of `status` answered within this."""


class _Kafka:
    """`status`'s reads of Kafka on confluent-kafka, all blocking (`snapshot` runs them in a
    thread): an AdminClient (metadata, groups, committed offsets, ListOffsets in
    read_committed) and, for the newest records of the outputs, an assigned Consumer."""

    def __init__(self, kafka: KafkaSettings, app_id: str) -> None:
        self.kafka = kafka
        config: dict[str, Any] = {
            **kafka.librdkafka_config(),
            "client.id": "storage-events-status",
            # `status` says itself, in one line, when Kafka cannot be read: librdkafka's line
            # per retry is dropped, by a logger of the commands' own (not the engine's).
            "logger": silent_log(),
        }
        self.admin = AdminClient(config)
        self._consumer_config = {
            **config,
            # Named, never joined (partitions are assigned) nor committed to; librdkafka looks
            # its coordinator up, which the stage group's Describe (that status needs) grants.
            "group.id": f"{app_id}-emit",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }

    def topic_partitions(self) -> dict[str, list[int]]:
        """Every topic's partitions (one metadata request; it never creates a topic)."""
        metadata = self.admin.list_topics(timeout=CALL_TIMEOUT_S)
        return {
            name: sorted(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None
        }

    def offsets(
        self, partitions: list[TopicPartition]
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        """Each partition's beginning and its end (the last stable offset: read_committed),
        two ListOffsets requests for them all."""
        if not partitions:
            return {}, {}
        found: list[dict[TopicPartition, int]] = []
        for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):  # type: ignore[no-untyped-call]
            futures = self.admin.list_offsets(
                {RdTopicPartition(tp.topic, tp.partition): spec for tp in partitions},
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=CALL_TIMEOUT_S,
            )
            found.append(
                {
                    TopicPartition(tp.topic, tp.partition): int(
                        future.result(CALL_TIMEOUT_S + 5).offset
                    )
                    for tp, future in futures.items()
                }
            )
        return found[0], found[1]

    def committed(self, group: str, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """`group`'s committed offsets of `partitions` (named: a whole-group OffsetFetch of a
        group the cluster never saw crashes confluent-kafka 2.16.2, streams.engine.offsets)."""
        if not partitions:
            return {}
        asked = [
            ConsumerGroupTopicPartitions(
                group, [RdTopicPartition(tp.topic, tp.partition) for tp in partitions]
            )
        ]
        answer = self.admin.list_consumer_group_offsets(asked, request_timeout=CALL_TIMEOUT_S)
        return {
            TopicPartition(tp.topic, tp.partition): tp.offset
            for tp in answer[group].result(CALL_TIMEOUT_S + 5).topic_partitions or []
            if tp.error is None and tp.offset >= 0
        }

    def group(
        self, name: str, topics: Iterable[str], partitions_of: Mapping[str, list[int]]
    ) -> GroupStatus:
        # ConsumerGroupDescribe for a KIP-848 group (DescribeGroups answers "Dead" without
        # members for one), DescribeGroups for a classic one: streams.engine.membership.
        described = describe(self.admin, name, CALL_TIMEOUT_S)
        members = tuple(
            Member(
                member.member_id,
                member.group_instance_id or member.client_id,
                member.host,
                tuple(
                    f"{tp.topic}[{tp.partition}]"
                    for tp in sorted(
                        member.assignment.topic_partitions if member.assignment else [],
                        key=lambda tp: (tp.topic, tp.partition),
                    )
                ),
            )
            for member in described.members
        )
        owners = {part: member.member_id for member in members for part in member.partitions}
        partitions = [
            TopicPartition(topic, partition)
            for topic in topics
            for partition in partitions_of.get(topic, ())
        ]
        committed = self.committed(name, partitions)
        beginnings, ends = self.offsets(partitions)
        rows = []
        for tp in partitions:
            value = committed.get(tp)
            rows.append(
                PartitionLag(
                    tp.topic,
                    tp.partition,
                    owners.get(f"{tp.topic}[{tp.partition}]"),
                    value,
                    ends[tp],
                    lag_of(value, beginnings[tp], ends[tp]),
                )
            )
        return GroupStatus(name, state_name(described), members, tuple(rows))

    def offsets_held(self, topic: str, numbers: Iterable[int]) -> int:
        """Offsets on `topic` over all partitions (no records read)."""
        partitions = [TopicPartition(topic, p) for p in numbers]
        beginnings, ends = self.offsets(partitions)
        return sum(ends[tp] - beginnings[tp] for tp in partitions)

    def newest_timestamp(self, topic: str, numbers: Iterable[int]) -> tuple[int, float | None]:
        """Offsets on `topic` and the timestamp of its newest committed record (its last
        LAST_RECORDS records per partition read, for at most 5 s)."""
        partitions = [TopicPartition(topic, p) for p in numbers]
        beginnings, ends = self.offsets(partitions)
        remaining = {tp for tp in partitions if ends[tp] > beginnings[tp]}
        newest: float | None = None
        if remaining:
            consumer = Consumer(self._consumer_config)
            try:
                consumer.assign(
                    [
                        RdTopicPartition(
                            tp.topic, tp.partition, max(beginnings[tp], ends[tp] - LAST_RECORDS)
                        )
                        for tp in sorted(remaining)
                    ]
                )
                deadline = time.monotonic() + 5.0
                while remaining and time.monotonic() < deadline:
                    for message in consumer.consume(100, 0.5):
                        tp = TopicPartition(message.topic() or "", message.partition() or 0)
                        error = message.error()
                        if error is not None:
                            if error.code() == KafkaError._PARTITION_EOF:
                                remaining.discard(tp)
                            elif error.fatal() or message.topic() is not None:
                                raise KafkaException(error)
                            continue
                        _, at = message.timestamp()
                        if at >= 0:
                            newest = max(newest or 0.0, at / 1000)
                        if (message.offset() or 0) + 1 >= ends.get(tp, 0):
                            remaining.discard(tp)
                    if remaining:
                        asked = [RdTopicPartition(tp.topic, tp.partition) for tp in remaining]
                        for position in consumer.position(asked):
                            tp = TopicPartition(position.topic, position.partition)
                            if position.offset != OFFSET_INVALID and position.offset >= ends[tp]:
                                remaining.discard(tp)
            finally:
                consumer.close()
        return sum(ends[tp] - beginnings[tp] for tp in partitions), newest


async def snapshot(
    settings: Settings,
    worker_urls: Sequence[str],
    previous: Snapshot | None = None,
    sample_s: float = 1.0,
) -> Snapshot:
    """Everything `render` shows. Events/s compare the workers' emitted totals with
    `previous`'s, or, without one, with a first read `sample_s` earlier."""
    bootstrap = settings.kafka.bootstrap_servers
    first: tuple[dict[str, float] | None, float] | None = None
    if previous is not None and previous.emitted_at is not None:
        first = (
            {i.name: i.emitted for i in previous.instances if i.emitted is not None},
            previous.emitted_at,
        )
    elif worker_urls:
        _, totals, read_at = await workers_emitted(worker_urls)
        first = (totals, read_at)
    listed = shown_instances(settings.instances, first[0] if first else None)
    groups, changelogs, outputs = await asyncio.to_thread(_read_kafka, settings, listed)
    if first is not None and previous is None:
        await asyncio.sleep(max(0.0, first[1] + sample_s - time.time()))
    workers, totals, read_at = await workers_emitted(worker_urls)
    instances = []
    aggregated = totals is not None and AGGREGATE in totals
    if aggregated:  # one row for them all, the workers' metrics have no other
        outputs.append((AGGREGATE, "(every instance)", None, None))
    counts = summed_counts(workers)
    for name, topic, held, newest in outputs:
        emitted = duplicates = stale = None
        if totals is not None and (name == AGGREGATE or not aggregated):
            emitted = totals.get(name, 0.0)
        if counts is not None and (name == AGGREGATE or not aggregated):
            duplicates = counts["duplicates"].get(name, 0.0)
            stale = counts["stale"].get(name, 0.0)
        rate = None
        if first is not None and first[0] is not None and emitted is not None:
            before = first[0].get(name, 0.0)
            elapsed = read_at - first[1]
            if elapsed > 0:
                rate = max(0.0, emitted - before) / elapsed
        instances.append(
            InstanceStatus(name, topic, held, newest, emitted, rate, duplicates, stale)
        )
    return Snapshot(
        bootstrap,
        time.time(),
        groups,
        changelogs,
        tuple(instances),
        tuple(workers),
        read_at if totals is not None else None,
        len(settings.instances) - len(listed),
        sum(counts["dead_letters"].values()) if counts is not None else None,
        settings.stream.dead_letter_topic,
    )


def _read_kafka(
    settings: Settings, listed: Sequence[InstanceConfig]
) -> tuple[
    tuple[GroupStatus, GroupStatus],
    dict[str, int],
    list[tuple[str, str, int | None, float | None]],
]:
    """What `snapshot` reads of Kafka: both stage groups, the changelogs' sizes, and each
    listed instance's output (blocking: a thread's)."""
    stream = settings.stream
    kafka = _Kafka(settings.kafka, stream.app_id)
    known = kafka.topic_partitions()
    groups = (
        kafka.group(
            f"{stream.app_id}-normalize", [topic.name for topic in stream.raw_topics], known
        ),
        kafka.group(f"{stream.app_id}-emit", [stream.repartition_topic], known),
    )
    changelogs: dict[str, int] = {}
    for table in (KEYS_TABLE, SEEN_TABLE, MARKS_TABLE):
        topic = changelog_topic(settings, table)
        if topic in known:
            changelogs[topic] = kafka.offsets_held(topic, known[topic])
    outputs: list[tuple[str, str, int | None, float | None]] = []
    for instance in listed:
        if instance.output_topic in known:
            records, newest = kafka.newest_timestamp(
                instance.output_topic, known[instance.output_topic]
            )
            outputs.append((instance.name, instance.output_topic, records, newest))
        else:
            outputs.append((instance.name, instance.output_topic, None, None))
    return groups, changelogs, outputs


def _when(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp} ({max(0.0, now - at):.0f} s ago)"


def _tag(member_id: str | None) -> str:
    """A member's short name: the first 8 hex digits of the UUID Kafka appends to its client id
    (or, with static membership, its group instance id)."""
    if member_id is None:
        return "(none)"
    if len(member_id) > 37 and member_id[-37] == "-":
        return member_id[-36:-28]
    return member_id[:8]  # KIP-848: a random 22-character id; its first 8 tell members apart


def _host(host: str) -> str:
    """Where a member connects from, as Kafka reports it (`/10.0.0.7`), without the slash."""
    return host.strip().lstrip("/").rstrip(":") or "?"


def _name(member: Member) -> str:
    """Who the member is: its member id without the UUID a classic member id ends with (the
    client id or the group instance id), else (KIP-848: a random id) its client id or group
    instance id."""
    member_id = member.member_id
    if len(member_id) > 37 and member_id[-37] == "-":
        return member_id[:-37]
    return member.client_id


def _restore(stages: Mapping[str, Any], now: float) -> str:
    restore = (stages.get("emit") or {}).get("restore")
    if not restore:
        return "restore: not started"
    partitions = ",".join(str(p) for p in restore.get("partitions", ()))
    if restore.get("state") == "restoring":
        since = float(restore.get("since", now))
        return f"restore: restoring partitions [{partitions}] for {now - since:.1f} s"
    return (
        f"restore: restored partitions [{partitions}]: {restore.get('records', 0)} changelog "
        f"records in {float(restore.get('seconds', 0.0)):.2f} s"
    )


def render(snap: Snapshot) -> str:
    """One screen of text."""
    now = snap.taken_at
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [f"storage-events status  kafka {snap.bootstrap}  {stamp}", ""]
    for group in snap.groups:
        plural = "" if len(group.members) == 1 else "s"
        lines.append(
            f"group {group.name}  {group.state}  {len(group.members)} member{plural}  "
            f"lag {group.lag}"
        )
        for member in group.members:
            owned = " ".join(member.partitions) or "nothing"
            lines.append(
                f"  member {_tag(member.member_id)} {_name(member)} on {_host(member.host)} "
                f"owns {owned}"
            )
        lines.append(f"  {'partition':<40} {'owner':<10} {'committed':>12} {'end':>12} {'lag':>10}")
        for row in group.partitions:
            committed = "-" if row.committed is None else str(row.committed)
            lines.append(
                f"  {row.topic + '[' + str(row.partition) + ']':<40} {_tag(row.owner):<10} "
                f"{committed:>12} {row.end:>12} {row.lag:>10}"
            )
        if not group.partitions:
            lines.append("  (its topics do not exist yet)")
        lines.append("")
    if snap.changelogs:
        sizes = ", ".join(f"{topic} {count}" for topic, count in snap.changelogs.items())
        lines.append(f"state changelogs (offsets a full restore reads): {sizes}")
    for worker in snap.workers:
        if worker.ready is None:
            lines.append(f"worker {worker.url}: {worker.error}")
            continue
        state = "ready" if worker.ready else "not ready"
        stuck = [
            f"{stage} stuck: {info['why']}"
            for stage, info in worker.stages.items()
            if isinstance(info, Mapping) and "why" in info
        ]
        lines.append(
            f"worker {worker.url}: {state}; {_restore(worker.stages, now)}"
            + "".join(f"; {text}" for text in stuck)
        )
    lines.append("")
    lines.append(
        f"  {'instance':<20} {'topic':<40} {'events/s':>9} {'emitted':>9} {'duplicate':>9} "
        f"{'stale':>7}  last event"
    )
    for instance in snap.instances:
        rate = "?" if instance.events_per_s is None else f"{instance.events_per_s:.1f}"
        emitted = "?" if instance.emitted is None else f"{instance.emitted:.0f}"
        duplicates = "?" if instance.duplicates is None else f"{instance.duplicates:.0f}"
        stale = "?" if instance.stale is None else f"{instance.stale:.0f}"
        last = "topic missing" if instance.records is None else _when(instance.last_event_at, now)
        if instance.name == AGGREGATE:
            last = "(the workers aggregate their instances' metrics)"
        lines.append(
            f"  {instance.name:<20} {instance.topic:<40} {rate:>9} {emitted:>9} "
            f"{duplicates:>9} {stale:>7}  {last}"
        )
    if snap.more_instances:
        lines.append(
            f"  ... and {snap.more_instances:,} more instance(s): those that emitted most are "
            "listed"
        )
    if not any(worker.ready is not None for worker in snap.workers):
        lines.append(
            "  (events/s, emitted, duplicate, stale: from the workers' /metrics; none answered)"
        )
    letters = "?" if snap.dead_letters is None else f"{snap.dead_letters:.0f}"
    lines.append("")
    lines.append(
        f"dead letters: {letters} to {snap.dead_letter_topic} (counts: since the workers "
        "started); `make dead-letters` shows each with its reason"
    )
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class ProgressCounts:
    """What the worker's progress line compares between two of its lines."""

    at: float
    records: Mapping[str, float]
    """Records handled per stage (storage_events_stage_records_total)."""
    dead_letters: float
    """storage_events_dead_lettered_total over every stage."""


def progress_line(
    previous: ProgressCounts, current: ProgressCounts, lags: Mapping[str, int | None]
) -> str:
    """The worker's one line a minute: records/s per stage since the last line, each stage's
    lag on this worker's partitions (None: not known yet), dead letters."""
    elapsed = max(current.at - previous.at, 1e-9)
    parts = []
    for stage in STAGES:
        rate = (current.records.get(stage, 0.0) - previous.records.get(stage, 0.0)) / elapsed
        lag = lags.get(stage)
        parts.append(f"{stage} {rate:.1f} records/s, lag {'?' if lag is None else lag}")
    new_letters = current.dead_letters - previous.dead_letters
    return (
        f"progress over {elapsed:.0f} s: {'; '.join(parts)}; dead letters "
        f"{current.dead_letters:.0f} (+{new_letters:.0f})"
    )


class ProgressReporter:
    """Reads the worker's counters for `progress_line`, remembering the last reading so each
    line covers the time since the previous one. The lag is the worker's own
    `storage_events_stage_lag` gauge (its partitions' end minus its position). `read`: a
    sample's value by name and labels (default: this process' registry; a worker running a
    stage per process reads its child's too, streams.stages.supervisor)."""

    def __init__(self, read: SampleReader | None = None) -> None:
        if read is None:
            from prometheus_client import REGISTRY

            read = REGISTRY.get_sample_value
        self._read = read
        self._last = self.counts()

    def counts(self) -> ProgressCounts:
        read = self._read
        records = {
            stage: read("storage_events_stage_records_total", {"stage": stage}) or 0.0
            for stage in STAGES
        }
        letters = sum(
            read("storage_events_dead_lettered_total", {"stage": stage}) or 0.0 for stage in STAGES
        )
        return ProgressCounts(time.monotonic(), records, letters)

    def lags(self) -> dict[str, int | None]:
        lags: dict[str, int | None] = {}
        for stage in STAGES:
            value = self._read("storage_events_stage_lag", {"stage": stage})
            lags[stage] = None if value is None else int(value)
        return lags

    def line(self) -> str:
        current = self.counts()
        text = progress_line(self._last, current, self.lags())
        self._last = current
        return text
